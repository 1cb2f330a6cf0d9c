"""`python -m trident ...`: the same command line as the `trident` script (cli.py)."""
import sys

from .cli import main

sys.exit(main())
