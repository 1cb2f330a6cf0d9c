"""Hierarchical all_reduce over nodes: reduce_scatter inside the node (trident), all_reduce
of each shard on the rail (torch.distributed across nodes), all_gather inside the node
(trident). The network carries 2(M-1)/M of N/L bytes per rank instead of a flat ring's
2(W-1)/W of N: L times fewer (cost.py).

A tensor whose size is not a multiple of the node size goes through a heap buffer padded
to one (the pad is reduced too and dropped); one that is and lies on the heap is used in
place. Reductions go through the node step's dtype: fp32 accumulation inside the node,
then the rail sums the rounded shards (two roundings for bf16/fp16, as NCCL's
hierarchical rings).
"""
from __future__ import annotations

import torch

from ...ccl import common
from .. import rail


def all_reduce(wctx, t: torch.Tensor, op: str) -> None:
    node, topo = wctx.node, wctx.topology
    flat = t.view(-1)
    size, parts = flat.numel(), topo.node_size
    shard_n = -(-size // parts)
    if size % parts == 0:
        whole = flat
    else:
        whole = common.scratch(node, parts * shard_n * t.element_size(), t.dtype,
                               "hier.whole")[:parts * shard_n]
        whole[:size].copy_(flat)
        whole[size:].zero_()
    shard = common.scratch(node, shard_n * t.element_size(), t.dtype, "hier.shard")[:shard_n]
    node.reduce_scatter(shard, whole, op)
    rail.all_reduce(node, topo.rail_group, shard, op)
    node.all_gather(whole, shard)
    if whole is not flat:
        flat.copy_(whole[:size])
