"""The inter-node steps: torch.distributed collectives over a sub-group (a rail: one rank
per node), NCCL on GPUs and gloo on the CPU emulation. trident has no transport of its
own between nodes.

On GPUs these are NCCL calls ordered on the current stream, so they are captured into a
CUDA graph like trident's kernels. Where GPU ranks share a GPU the groups are gloo, which
cannot reduce CUDA tensors: the step then goes through host copies (`staged`), which is
correct but synchronises the host and is not capturable (the one-GPU test mode only).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import nccl


def staged(ctx, group) -> bool:
    """Whether the steps over `group` go through host memory: GPU tensors and a gloo group
    (ranks that share a GPU). Asked of the group itself: the node's own Context counts
    only the ranks of its node on its GPU."""
    return ctx.device.type == "cuda" and dist.get_backend(group) == "gloo"


def _on_host(ctx, group, fn, *tensors):
    """fn(*tensors), through CPU copies when `staged`; tensors[0] is the output."""
    if not staged(ctx, group):
        fn(*tensors)
        return
    host = [t.cpu() for t in tensors]
    fn(*host)
    tensors[0].copy_(host[0])


def all_reduce(ctx, group, t: torch.Tensor, op: str) -> None:
    _on_host(ctx, group, lambda x: dist.all_reduce(x, op=nccl._REDUCE[op], group=group), t)


def all_gather(ctx, group, out: torch.Tensor, inp: torch.Tensor) -> None:
    """out (1-D) = every member's inp (1-D), in group-rank order; any dtype (as bytes)."""
    _on_host(ctx, group, lambda o, i: nccl.all_gather_single(
        o.view(torch.uint8), i.view(torch.uint8), group=group), out, inp)


def reduce_scatter(ctx, group, out: torch.Tensor, inp: torch.Tensor, op: str) -> None:
    """out (1-D) = this member's block of the op over members of inp (1-D)."""
    if not staged(ctx, group):
        nccl.reduce_scatter_single(out, inp, op=nccl._REDUCE[op], group=group)
        return
    host = inp.cpu()                    # gloo of older torch has no reduce-scatter
    dist.all_reduce(host, op=nccl._REDUCE[op], group=group)
    out.copy_(host.view(dist.get_world_size(group), -1)[dist.get_rank(group)])


def broadcast(ctx, group, t: torch.Tensor, src: int) -> None:
    """t (1-D) on every member = t of group rank `src`."""
    _on_host(ctx, group, lambda x: dist.broadcast(x.view(torch.uint8),
                                           src=dist.get_global_rank(group, src), group=group), t)


def all_to_all(ctx, group, out: torch.Tensor, inp: torch.Tensor, out_splits=None,
               in_splits=None) -> None:
    """Rows (dim 0) of inp to the members by in_splits, received by out_splits (None:
    even); any dtype (as bytes)."""
    _on_host(ctx, group, lambda o, i: dist.all_to_all_single(
        nccl._bytes(o, rows=True), nccl._bytes(i, rows=True), out_splits, in_splits,
        group=group), out, inp)
