"""matmul_all_reduce: out [M, N] = all_reduce(a @ w.T) + bias (row-parallel linear whose
output every rank needs). a: [M, K_local], w: [N, K_local], bias: [N] added once.

The kernel is matmul_reduce_scatter's (see there) with tiles owned round-robin by the
ranks and a third role: each owner reduces its tiles, keeps them in a heap buffer and
flags them on every rank; gather programs pull the tiles of the other owners into `out`.
Every rank gets bitwise the same result (one rank sums each tile, in rank order). M need
not be divisible by the world size. Both GEMM cores (TRIDENT_GEMM=classic|tma, or the
gemm= option) as in matmul_reduce_scatter.

When it wins: like matmul_reduce_scatter, with twice the traffic (reduce-scatter then
all-gather of M*N); small M (decode) is latency-bound, where one launch beats cuBLAS +
NCCL's two. Crossovers: trident/ops/crossover.json (selector.py).
"""
from __future__ import annotations

import torch

from . import plain, selector
from ..plans import Plan
from ._common import check_inputs, new_plan, run
from .matmul_reduce_scatter import matmul_reduce_fused


def matmul_all_reduce(ctx, a, w, bias=None, out=None, algorithm: str = "auto",
                      **options) -> torch.Tensor:
    """all_reduce(a @ w.T) + bias -> [a.shape[0], w.shape[0]].

    algorithm: "auto" (the selector), "fused" or "plain" (also "nccl": cuBLAS + NCCL
    all-reduce). options go to the fused kernel (config, split_k, gemm: "auto", "classic"
    or "tma"; see matmul_reduce_scatter.matmul_reduce_fused).
    """
    return run(ctx, "matmul_all_reduce", _plan, a, w, bias, out, algorithm, options)


def _plan(ctx, a, w, bias, out, algorithm, options) -> Plan:
    if not isinstance(a, torch.Tensor) or a.dim() != 2:
        check_inputs(ctx, "matmul_all_reduce", a, w, bias, out, ())
    shape = (a.shape[0], w.shape[0])
    check_inputs(ctx, "matmul_all_reduce", a, w, bias, out, shape, empty_k=True)
    path = selector.resolve(ctx, "matmul_all_reduce", algorithm, a.shape[0], w.shape[0], None)
    plan = new_plan(ctx, a, w, bias, out, shape, path)
    if path == "plain":
        plan.add(lambda ts: plain.matmul_all_reduce(ctx, *ts), graphable=False)
    else:
        matmul_reduce_fused(ctx, plan, a, w, bias, plan.tensors[3], all_reduce=True, **options)
    return plan
