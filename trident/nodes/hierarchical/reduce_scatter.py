"""Hierarchical reduce_scatter over nodes, the mirror of all_gather.py: one copy orders
the input by local index (block (node k, local l) of [M, L, m] to [L, M, m]), the node
step (trident) reduce-scatters it, so local rank l holds the node's sum of the blocks
(k, l) of every node k, then the rail step (torch.distributed across nodes) reduces those
and leaves node k's block with it. The network carries (M-1) blocks per rank, L times
fewer than a flat ring (cost.py). Reductions: fp32 inside the node, then the rail sums
the rounded partials (two roundings for bf16/fp16).
"""
from __future__ import annotations

import torch

from ...ccl import common
from .. import rail


def reduce_scatter(wctx, out: torch.Tensor, inp: torch.Tensor, op: str) -> None:
    node, topo = wctx.node, wctx.topology
    nodes, parts, m = topo.num_nodes, topo.node_size, out.numel()
    size = out.element_size()
    by_local = common.scratch(node, parts * nodes * m * size, inp.dtype,
                              "hier.node")[:parts * nodes * m]
    by_local.view(parts, nodes, m).copy_(inp.view(nodes, parts, m).transpose(0, 1))
    partial = common.scratch(node, nodes * m * size, inp.dtype, "hier.rail")[:nodes * m]
    node.reduce_scatter(partial, by_local, op)
    rail.reduce_scatter(node, topo.rail_group, out.view(-1), partial, op)
