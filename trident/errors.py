"""`trident.errors`: what trident raises, by its public name (`except
trident.errors.CallMismatch`). The classes, and the codes that device waits record, live in
trident/runtime/errors.py; this module only names them here."""
from .runtime.errors import *  # noqa: F401,F403
