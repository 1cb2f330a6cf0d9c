"""The plain path: torch.distributed (NCCL on GPUs, gloo on the CPU emulation) + torch.matmul
(cuBLAS). What the selector falls back to where fusion does not pay, and the baseline of
`trident bench ops`. Inputs are checked by the callers. The bias is added by rank 0's GEMM
before the reduction, so it is added once and costs no extra pass. It cannot run where
ranks share a GPU (NCCL needs a GPU per rank): auto never picks it then, and naming it
raises a ValueError (auto.resolve). The "plain" schedule (schedules.py; alias "nccl").
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..ccl.nccl import all_gather_single, reduce_scatter_single
from .schedules import register


def matmul(a, w, bias=None, out=None) -> torch.Tensor:
    """a @ w.T (+ bias, converted to a's dtype) by torch: cuBLAS on GPUs. The host GEMM
    of every schedule that has one (plain, sequential, pipelined).

    On the CPU a strided operand is made contiguous first: torch's bf16 CPU GEMM reads
    a row's padding past K on some x86 CPUs (torch 2.13; an odd K, or K=40 on CI's
    machine), so the uninitialised rest of a column slice leaked NaN into whole rows
    (tests/fuzz/test_ops.py, strided a; tests/ops/test_host_gemm.py)."""
    if a.device.type == "cpu":
        a, w = a.contiguous(), w.contiguous()
    if bias is not None:
        return torch.addmm(bias.to(a.dtype), a, w.t(), out=out)
    return torch.matmul(a, w.t(), out=out)


def all_gather_matmul(ctx, a, w, bias=None, out=None) -> torch.Tensor:
    gathered = torch.empty(a.shape[0] * ctx.world_size, a.shape[1], dtype=a.dtype,
                           device=a.device)
    all_gather_single(gathered, a.contiguous(), group=ctx.group)
    return matmul(gathered, w, bias, out)


def matmul_reduce_scatter(ctx, a, w, bias=None, out=None) -> torch.Tensor:
    partial = matmul(a, w, bias if ctx.rank == 0 else None)
    if out is None:
        out = torch.empty(a.shape[0] // ctx.world_size, w.shape[0], dtype=a.dtype,
                          device=a.device)
    if ctx.backend == "cuda":
        target = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
        reduce_scatter_single(target, partial, group=ctx.group)
    else:                                   # gloo has no reduce-scatter
        dist.all_reduce(partial, group=ctx.group)
        target = partial.chunk(ctx.world_size)[ctx.rank]
    if target is not out:
        out.copy_(target)
    return out


def matmul_all_reduce(ctx, a, w, bias=None, out=None) -> torch.Tensor:
    if out is not None and out.is_contiguous():
        matmul(a, w, bias if ctx.rank == 0 else None, out)
        dist.all_reduce(out, group=ctx.group)
        return out
    partial = matmul(a, w, bias if ctx.rank == 0 else None)
    dist.all_reduce(partial, group=ctx.group)
    return partial if out is None else out.copy_(partial)


def _shared(op, a, w) -> tuple:
    """What the tensor handed to torch.distributed has alike on every rank: all_gather_matmul
    gathers a (its N, w's rows, may differ between ranks); the row-parallel ops reduce the
    [M, N] product (their K, the shard, may differ: a rank may hold none)."""
    if op == "all_gather_matmul":
        return tuple(a.shape), str(a.dtype)
    return a.shape[0], w.shape[0], str(a.dtype)


def _build(ctx, plan, op, a, w, bias, out) -> None:
    """The "plain" schedule: one host step (torch.distributed is not graph-capturable
    through a launch plan; NCCL's own capture works when the caller captures the call)."""
    fn = globals()[op]
    ctx.agree_once(op, "plain", *_shared(op, a, w))
    plan.add(lambda ts: fn(ctx, *ts), graphable=False)


register("plain", _build, needs_nccl=True, about="cuBLAS + NCCL through torch")
