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

from ..runtime import errors
from ..runtime.context_exchange import failed, mark_failed
from ..ccl import nccl
from . import topology


def guarded(ctx, group, what: str, fn, *args) -> None:
    """fn(*args), a torch.distributed collective over `group`: a transport error (the
    group's timeout, a peer's connection lost) becomes InterNodeError, named after `what`
    (the op), with this rank and the group's ranks. The group's timeout is the context's
    host timeout at init (topology.py), the one reported. A group that failed so
    is not used again: later calls over it raise errors.GroupUnusable at once."""
    earlier = failed(group)
    if earlier is not None:
        raise errors.GroupUnusable(f"{what} (its step between nodes)", dist.get_rank(), earlier)
    try:
        fn(*args)
    except RuntimeError as e:
        mark_failed(group, f"{what} (its step between nodes)")
        ranks = dist.get_process_group_ranks(group)
        timeout = topology.group_timeout_s(group, ctx.host_timeout_s)
        raise errors.InterNodeError(what, dist.get_rank(), ranks, timeout,
                                    " ".join(str(e).split())[:200]) from None


def staged(ctx, group) -> bool:
    """Whether the steps over `group` go through host memory: GPU tensors and a gloo group
    (ranks that share a GPU). Asked of the group itself: the node's own Context counts
    only the ranks of its node on its GPU."""
    return ctx.device.type == "cuda" and dist.get_backend(group) == "gloo"


def _on_host(ctx, group, fn, *tensors, what: str = "a step"):
    """fn(*tensors), through CPU copies when `staged`; tensors[0] is the output."""
    if not staged(ctx, group):
        guarded(ctx, group, what, fn, *tensors)
        return
    host = [t.cpu() for t in tensors]
    guarded(ctx, group, what, fn, *host)
    tensors[0].copy_(host[0])


def all_reduce(ctx, group, t: torch.Tensor, op: str, what: str = "all_reduce") -> None:
    _on_host(ctx, group, lambda x: dist.all_reduce(x, op=nccl._REDUCE[op], group=group), t,
             what=what)


def all_gather(ctx, group, out: torch.Tensor, inp: torch.Tensor) -> None:
    """out (1-D) = every member's inp (1-D), in group-rank order; any dtype (as bytes)."""
    _on_host(ctx, group, lambda o, i: nccl.all_gather_single(
        o.view(torch.uint8), i.view(torch.uint8), group=group), out, inp, what="all_gather")


def reduce_scatter(ctx, group, out: torch.Tensor, inp: torch.Tensor, op: str) -> None:
    """out (1-D) = this member's block of the op over members of inp (1-D)."""
    if not staged(ctx, group):
        guarded(ctx, group, "reduce_scatter", lambda: nccl.reduce_scatter_single(
            out, inp, op=nccl._REDUCE[op], group=group))
        return
    host = inp.cpu()                    # gloo of older torch has no reduce-scatter
    guarded(ctx, group, "reduce_scatter",
            lambda: dist.all_reduce(host, op=nccl._REDUCE[op], group=group))
    out.copy_(host.view(dist.get_world_size(group), -1)[dist.get_rank(group)])


def broadcast(ctx, group, t: torch.Tensor, src: int) -> None:
    """t (1-D) on every member = t of group rank `src`."""
    _on_host(ctx, group, lambda x: dist.broadcast(x.view(torch.uint8),
                                           src=dist.get_global_rank(group, src), group=group), t,
             what="broadcast")


def all_to_all(ctx, group, out: torch.Tensor, inp: torch.Tensor, out_splits=None,
               in_splits=None) -> None:
    """Rows (dim 0) of inp to the members by in_splits, received by out_splits (None:
    even); any dtype (as bytes)."""
    _on_host(ctx, group, lambda o, i: dist.all_to_all_single(
        nccl._bytes(o, rows=True), nccl._bytes(i, rows=True), out_splits, in_splits,
        group=group), out, inp, what="all_to_all")
