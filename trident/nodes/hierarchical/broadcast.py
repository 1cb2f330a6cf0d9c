"""Hierarchical broadcast over nodes: the source sends on its rail (torch.distributed
across nodes, to the rank of its local index on every node), then every node broadcasts
from that rank (trident). The network carries the tensor once per node (cost.py)."""
from __future__ import annotations

import torch

from .. import rail


def broadcast(wctx, t: torch.Tensor, src: int) -> None:
    node, topo = wctx.node, wctx.topology
    src_node, src_local = divmod(src, topo.node_size)
    if topo.local_rank == src_local:       # the source's rail; rail rank i is node i
        rail.broadcast(node, topo.rail_group, t.view(-1), src_node)
    node.broadcast(t, src=src_local)
