"""All-reduce algorithms, one per file; `ALGORITHMS` maps their names to them."""
from .one_shot import one_shot
from .two_shot import two_shot

ALGORITHMS = {"one_shot": one_shot, "two_shot": two_shot}
