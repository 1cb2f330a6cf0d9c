"""All-gather algorithms, one per file; `ALGORITHMS` maps their names to them."""
from .pull import pull
from .push import push
from .push_direct import push_direct

ALGORITHMS = {"push": push, "pull": pull, "push_direct": push_direct}
