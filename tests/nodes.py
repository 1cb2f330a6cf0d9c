"""Rank pools whose ranks form nodes on one machine (TRIDENT_NODE_SIZE in the ranks'
environment, trident/nodes/topology.py): for the tests of contexts across nodes. Pools made by
`nodes_pool` are shared by every test module of the session (rank start-up dominates on
the CPU) and closed at its end (conftest.py)."""
import os

import torch

from trident.nodes import topology
from trident.nodes.topology import pool_in_nodes
from trident.runtime.launch import RankPool, default_backend

_pools: dict[tuple[int, int], RankPool] = {}


def nodes_pool(world_size: int, node_size: int) -> RankPool:
    """The session's pool of world_size ranks in nodes of node_size (32 MiB heaps)."""
    pool = _pools.get((world_size, node_size))
    if pool is None or pool.closed:
        pool = _pools[(world_size, node_size)] = pool_in_nodes(
            world_size, node_size, backend=default_backend(), heap_size=32 << 20,
            timeout=60.0, run_timeout=600.0)
    return pool


def close_pools() -> None:
    for p in _pools.values():
        p.close()
    _pools.clear()


def _layouts():
    """(world size, node sizes to test; the first is the pool's own) on this machine;
    TRIDENT_TEST_NODE_WORLD=4 forces 4 ranks as 2 x 2 and 4 x 1 (e.g. on GPUs that the
    ranks then share, gloo between nodes)."""
    if os.environ.get("TRIDENT_TEST_NODE_WORLD") == "4":
        return 4, (2, 1)
    if default_backend() == "cuda" and 2 <= torch.cuda.device_count() < 4:
        return 2, (1,)
    return 4, (2, 1)


WORLD, NODE_SIZES = _layouts()


class Layout:
    """Runs functions on WORLD ranks as nodes of `node_size`: NODE_SIZES[0] is the pool's
    own context (its ranks start with TRIDENT_NODE_SIZE set to it); another size, a second
    context made for the call in the same ranks (cheaper than a second pool: rank start-up
    dominates on the CPU)."""

    def __init__(self, pool: RankPool, node_size: int):
        self.pool, self.node_size = pool, node_size

    def run(self, fn, *args):
        if self.node_size == NODE_SIZES[0]:
            return self.pool.run(fn, *args)
        return self.pool.run(in_nodes_of, self.node_size, fn, *args)


def in_nodes_of(ctx, node_size, fn, *args, env=topology.NODE_SIZE_ENV):
    """fn(a new context, *args) with the ranks' `env` set to node_size instead of the
    pool's TRIDENT_NODE_SIZE."""
    import trident
    saved = os.environ.pop(topology.NODE_SIZE_ENV)
    os.environ[env] = str(node_size)
    try:
        with trident.init(heap_size=8 << 20, timeout=ctx.timeout_s) as other:
            return fn(other, *args)
    finally:
        os.environ.pop(env)
        os.environ[topology.NODE_SIZE_ENV] = saved
