"""Rank pools whose ranks form nodes on one machine (TRIDENT_NODE_SIZE in the ranks'
environment, trident/topology.py): for the tests of contexts across nodes."""
import os

from trident import topology
from trident.launch import RankPool


def pool_in_nodes(world_size: int, node_size: int, **pool_options) -> RankPool:
    """A RankPool of world_size ranks in nodes of node_size consecutive ranks; this
    process's own TRIDENT_NODE_SIZE is left as it was."""
    saved = os.environ.get(topology.NODE_SIZE_ENV)
    os.environ[topology.NODE_SIZE_ENV] = str(node_size)
    try:
        return RankPool(world_size, **pool_options)
    finally:
        if saved is None:
            os.environ.pop(topology.NODE_SIZE_ENV)
        else:
            os.environ[topology.NODE_SIZE_ENV] = saved
