"""The "nccl" algorithm: hand the collective to torch.distributed on the context's group
(NCCL on GPUs, gloo on the CPU emulation). The selector picks it where trident loses.

It cannot run where GPU ranks share a GPU (`ctx.nccl_available` False): NCCL refuses two
ranks on one device, so the group is gloo there, which lacks most collectives on CUDA
tensors. Then the selectors never pick it, asking for it raises a ValueError that says
why (`check_available`), and host-side values cross the group on the CPU (`host_device`).
"""
import math

import torch
import torch.distributed as dist

# torch >= 2.13 renamed the *_into_tensor / *_tensor collectives (same signatures); the GPU
# images have torch 2.11, which only has the old names.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def available(ctx) -> bool:
    """Whether torch.distributed collectives on this context's device tensors can run."""
    return getattr(ctx, "nccl_available", True)


def unavailable_reason(ctx) -> str:
    """Why they cannot: how many ranks share this rank's GPU."""
    n = getattr(ctx, "ranks_per_device", 2)
    who = f"{n} ranks share one GPU here" if n > 1 else "ranks of this job share GPUs"
    return (f"NCCL is not available: {who} (NCCL needs one GPU per rank; the host group "
            f"is gloo)")


def check_available(ctx, what: str, choices) -> None:
    """Raise a ValueError naming the ranks per GPU and `choices` (the algorithms that can
    run) unless the NCCL path can run on `ctx`."""
    if not available(ctx):
        raise ValueError(f"{what}: {unavailable_reason(ctx)}; choose one of {list(choices)}")


def host_device(ctx) -> torch.device:
    """Where a tensor of host-side values (checks, timings) must live for a collective on
    ctx.group: ctx.device under NCCL (and on the CPU emulation), the CPU under a gloo group
    of GPU ranks that share a GPU."""
    return ctx.device if available(ctx) else torch.device("cpu")


_REDUCE = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def all_reduce(ctx, t, op):
    dist.all_reduce(t, op=_REDUCE[op], group=ctx.group)


def _bytes(t, rows: bool = False):
    """Moving ops carry any dtype: hand the backend bytes (gloo has no bool, say).
    rows=True keeps dim 0, so that all_to_all's row splits still apply."""
    # explicit row length: reshape(0, -1) is ambiguous for a rank with no rows
    flat = t.reshape(t.shape[0], math.prod(t.shape[1:])) if rows else t.reshape(-1)
    return flat.view(torch.uint8)


def all_gather(ctx, out, inp):
    all_gather_single(_bytes(out), _bytes(inp), group=ctx.group)


def reduce_scatter(ctx, out, inp, op):
    reduce_scatter_single(out, inp, op=_REDUCE[op], group=ctx.group)


def all_to_all(ctx, out, inp, out_splits, in_splits):
    dist.all_to_all_single(_bytes(out, rows=True), _bytes(inp, rows=True), out_splits, in_splits,
                           group=ctx.group)


def broadcast(ctx, t, src):
    dist.broadcast(_bytes(t), src=dist.get_global_rank(ctx.group, src), group=ctx.group)
