"""All-to-all algorithms, one per file; `ALGORITHMS` maps their names to them."""
from .one_shot import one_shot
from .push import push

ALGORITHMS = {"push": push, "one_shot": one_shot}
