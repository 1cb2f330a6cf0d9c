"""All-gather algorithms, one per file; `ALGORITHMS` maps their names to them."""
from .pull import pull
from .push import push

ALGORITHMS = {"push": push, "pull": pull}
