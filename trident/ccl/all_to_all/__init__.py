"""All-to-all algorithms, one per file; `ALGORITHMS` maps their names to them."""
from .push import push

ALGORITHMS = {"push": push}
