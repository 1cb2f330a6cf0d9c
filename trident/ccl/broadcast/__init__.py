"""Broadcast algorithms, one per file; `ALGORITHMS` maps their names to them."""
from .push import push
from .relay import relay

ALGORITHMS = {"push": push, "relay": relay}
