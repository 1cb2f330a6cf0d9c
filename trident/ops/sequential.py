"""The "sequential" schedule: trident's own collective and cuBLAS, one after the other in
one stream, with the intermediates on the symmetric heap so that the collective stages
nothing.

    all_gather_matmul      all_gather(G, a) into a heap buffer G, then out = G @ w.T + bias
    matmul_reduce_scatter  P = a @ w.T (+ bias on rank 0) into a heap buffer, then
                           reduce_scatter(R, P) into a heap buffer, then out = R
    matmul_all_reduce      P = a @ w.T (+ bias on rank 0) into a heap buffer, then
                           all_reduce(P) in place, then out = P

The collective is trident's (trident/ccl): its algorithm is the ccl selector's choice
among trident's own (never NCCL), or the `collective=` option by name; its launch plan is
built with the op's plan, on the op's heap buffers, so a warm call runs the GEMM, one
pre-bound launch and (row-parallel) one copy, with no lookup in between. The row-parallel
results are copied out because the op returns a fresh tensor (or the caller's `out`), not a
heap buffer that the next call overwrites: one M*N (M*N/world) copy, small at the sizes
where this schedule is the choice.

When it wins: at decode sizes, where the GEMM reads the weights at HBM speed and the
collective is latency: trident's one-shot collectives take a fraction of NCCL's time there
(issue 30: 0.22-0.36x eagerly, 0.51-0.82x from graphs, up to 1 MiB), which is all this
saves over "plain". It is the floor each fusion must beat. Not measured as an op yet.
"""
from __future__ import annotations

import torch

from .. import ccl
from ..ccl import common as ccl_common
from ..ccl import selector as ccl_selector
from . import _common, plain
from .schedules import register

OPTIONS = ("collective",)


def _buffer(ctx, role: str, dtype: torch.dtype, *shape) -> torch.Tensor:
    """A heap buffer of `shape` for `role`, one per power-of-two size class, kept for the
    context's life (the same on every rank: shapes are the ones all ranks share)."""
    n = 1
    for s in shape:
        n *= s
    nbytes = _common._bucket(max(n * dtype.itemsize, 256))
    buf = ctx.workspace(("trident.ops.sequential", role, nbytes),
                        lambda c: c.empty(nbytes, dtype=torch.uint8))
    return buf[:n * dtype.itemsize].view(dtype).view(*shape)


def _collective(ctx, coll: str, nbytes: int, name: str | None) -> str:
    """trident's algorithm for the collective `coll` of nbytes per rank: `name`, or the
    ccl selector's choice without NCCL (agreed tables: the same on every rank)."""
    if name is not None:
        return name
    ccl_common.check_tables(ctx, coll)
    return ccl_selector.select(coll, nbytes, ctx.world_size, graph=bool(ctx.capturing()),
                               nccl=False)


def _sub(plan, sub, tensors, call_a: bool = False) -> None:
    """Add the collective's finished plan `sub`, run on its fixed heap `tensors`; with
    call_a, its second tensor is the call's a (tensor 0), read at each run: the plan's
    key holds a's address, never a itself. A plan that kept the caller's a kept a block
    of a CUDA-graph pool alive (torch.compile's reduce-overhead records with copies of
    the inputs made there, and drops them: "Detected 1 tensor(s) in the cudagraph pool
    not tracked as outputs")."""
    sub.finish("off")
    run = sub.run
    if call_a:
        fixed = tensors[0]
        plan.add(lambda ts: run((fixed, ts[0])), graphable=sub.graphable)
    else:
        plan.add(lambda ts: run(tensors), graphable=sub.graphable)


def _gemm_step(plan, ctx, a, bias, dst, with_bias: bool) -> None:
    """dst = a @ w.T (+ bias) through cuBLAS. a: a buffer fixed at build, or None (the
    call's a); dst: likewise, None for the call's output (read at each run). A bias of
    another dtype than a is converted into a buffer of the plan first (addmm needs a's
    dtype; a conversion per call would allocate)."""
    cast = None
    if with_bias and bias.dtype != plan.tensors[0].dtype:
        dev, dtype = ctx.device, plan.tensors[0].dtype
        cast = _common.outside_graph_pools(
            dev, "the sequential schedule's bias", lambda: torch.empty(
                bias.shape[0], dtype=dtype, device=dev))
    fixed_a, fixed_dst = a, dst

    def step(ts):
        x = ts[0] if fixed_a is None else fixed_a
        y = ts[3] if fixed_dst is None else fixed_dst
        b = (ts[2] if cast is None else cast.copy_(ts[2])) if with_bias else None
        plain.matmul(x, ts[1], b, y)
    plan.add(step, graphable=not (dst is None and _common.is_stand_in(plan.tensors[3])))


def build(ctx, plan, op: str, a, w, bias, out, collective: str | None = None) -> None:
    """Add the sequential schedule's steps for `op` to `plan` (see the module docstring).
    collective: the trident algorithm of the collective (e.g. "one_shot"), default the
    ccl selector's choice among trident's own."""
    ccl_common.agreed(ctx)
    graph = bool(ctx.capturing())
    M, N = a.shape[0], w.shape[0]
    if op == "all_gather_matmul":
        G = _buffer(ctx, "gathered", a.dtype, M * ctx.world_size, a.shape[1])
        # made on every rank (a heap buffer): used where a is not contiguous, which the
        # all-gather needs -- a copy of this rank's own, into it
        mine = _buffer(ctx, "local a", a.dtype, *a.shape)
        copied = not a.is_contiguous()
        if copied:
            plan.add(lambda ts: mine.copy_(ts[0]))
            a = mine
        name = _collective(ctx, "all_gather", a.numel() * a.element_size(), collective)
        sub = ccl.build_plan(ctx, "all_gather", (G, a), (), name, graph)
        # the all-gather reads the copy, or the call's a (its address is in the plan's key)
        _sub(plan, sub, (G, a), call_a=not copied)
        _gemm_step(plan, ctx, G, bias, None, bias is not None)
        return
    P = _buffer(ctx, "partial", a.dtype, M, N)
    _gemm_step(plan, ctx, None, bias, P, bias is not None and ctx.rank == 0)
    if op == "matmul_all_reduce":
        name = _collective(ctx, "all_reduce", P.numel() * P.element_size(), collective)
        flat = P.view(-1)
        _sub(plan, ccl.build_plan(ctx, "all_reduce", (flat,), ("sum",), name, graph),
             (flat,))
        result = P
    else:
        R = _buffer(ctx, "scattered", a.dtype, M // ctx.world_size, N)
        name = _collective(ctx, "reduce_scatter", R.numel() * R.element_size(), collective)
        _sub(plan, ccl.build_plan(ctx, "reduce_scatter", (R, P), ("sum",), name, graph),
             (R, P))
        result = R
    plan.add(lambda ts: ts[3].copy_(result),
             graphable=not _common.is_stand_in(plan.tensors[3]))


register("sequential", build, options=OPTIONS,
         about="trident collective + cuBLAS, one stream, heap intermediates")
