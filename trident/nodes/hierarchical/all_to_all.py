"""Hierarchical all_to_all over nodes, even splits: each row block travels once inside
its node (trident), to the rank of its destination's local index, then once on that
rail (torch.distributed across nodes) -- DeepEP's two-stage routing. Each rank sends
M-1 network messages instead of W-L; the network bytes are the same as a flat
all_to_all's (cost.py), so it wins where messages are small.

Layout (M nodes of L ranks, block (k, l) = the m elements for rank k*L + l):
inp [M, L, m] -> ordered by destination local index [L, M, m] -> node all_to_all: local
rank l gets [L, M, m] (from each local source: its blocks for (k, l)) -> ordered by
destination node [M, L, m] -> rail all_to_all: node k gets [M, L, m] = the blocks from
every rank (k', l') in world order, which is `out`.

Uneven splits go through one torch.distributed all_to_all over the world instead
(`flat`): the node step would need every rank's split counts, a host exchange per call.
"""
from __future__ import annotations

import torch

from ...ccl import common
from .. import rail


def all_to_all(wctx, out: torch.Tensor, inp: torch.Tensor) -> None:
    node, topo = wctx.node, wctx.topology
    nodes, parts, m = topo.num_nodes, topo.node_size, inp.numel() // topo.world_size
    size, n = inp.element_size(), inp.numel()
    by_local = common.scratch(node, n * size, inp.dtype, "hier.node")[:n]
    by_local.view(parts, nodes, m).copy_(inp.view(nodes, parts, m).transpose(0, 1))
    received = common.scratch(node, n * size, inp.dtype, "hier.rail")[:n]
    node.all_to_all(received, by_local)
    by_node = common.scratch(node, n * size, inp.dtype, "hier.send")[:n]
    by_node.view(nodes, parts, m).copy_(received.view(parts, nodes, m).transpose(0, 1))
    rail.all_to_all(node, topo.rail_group, out.view(-1), by_node)


def flat(wctx, out: torch.Tensor, inp: torch.Tensor, out_splits, in_splits) -> None:
    """One all_to_all over the whole world through torch.distributed (any splits)."""
    rail.all_to_all(wctx.node, wctx.group, out, inp, out_splits, in_splits)
