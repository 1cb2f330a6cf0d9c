"""All-gather algorithms, one per file; `ALGORITHMS` maps their names to them.
"gluon" is never chosen by "auto" (selector.EXPLICIT_ONLY says why)."""
from .gluon import gluon
from .pull import pull
from .push import push
from .push_direct import push_direct

ALGORITHMS = {"push": push, "pull": pull, "push_direct": push_direct, "gluon": gluon}
