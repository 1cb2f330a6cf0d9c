"""Hierarchical all_gather over nodes: all_gather on the rail first (torch.distributed
across nodes: this rank receives the blocks of its local index on every node), then
all_gather of those inside the node (trident), then one copy that puts rank r's block at
position r of the world. The network carries (M-1) blocks per rank, L times fewer than
gathering the node first and then exchanging whole nodes on the rail (cost.py).

Layout (M nodes of L ranks, block b of m elements, rank r = node k * L + local l):
rail step -> [M, m] (node k's block of local l); node step -> [L, M, m]; out [M, L, m]
= its transpose, which is the world's rank order.
"""
from __future__ import annotations

import torch

from ...ccl import common
from .. import rail


def all_gather(wctx, out: torch.Tensor, inp: torch.Tensor) -> None:
    node, topo = wctx.node, wctx.topology
    nodes, parts, m = topo.num_nodes, topo.node_size, inp.numel()
    size = inp.element_size()
    on_rail = common.scratch(node, nodes * m * size, inp.dtype, "hier.rail")[:nodes * m]
    rail.all_gather(node, topo.rail_group, on_rail, inp.reshape(-1))
    gathered = common.scratch(node, parts * nodes * m * size, inp.dtype,
                              "hier.node")[:parts * nodes * m]
    node.all_gather(gathered, on_rail)
    out.view(nodes, parts, m).copy_(gathered.view(parts, nodes, m).transpose(0, 1))
