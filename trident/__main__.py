"""`python -m trident ...`: the same command line as the `trident` script (tools/cli.py)."""
import sys

from .tools.cli import main

sys.exit(main())
