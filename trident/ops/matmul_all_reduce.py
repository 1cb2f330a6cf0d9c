"""matmul_all_reduce: out [M, N] = all_reduce(a @ w.T) + bias (row-parallel linear whose
output every rank needs). a: [M, K_local], w: [N, K_local], bias: [N] added once.

The kernel is matmul_reduce_scatter's (see there) with tiles owned round-robin by the
ranks and a third role: each owner reduces its tiles, keeps them in a heap buffer and
flags them on every rank; gather programs pull the tiles of the other owners into `out`.
Every rank gets bitwise the same result (one rank sums each tile, in rank order). M need
not be divisible by the world size. The GEMM cores (TRIDENT_GEMM=classic|tma|gluon, or the
gemm= option) as in matmul_reduce_scatter.

When it wins: like matmul_reduce_scatter, with twice the traffic (reduce-scatter then
all-gather of M*N); small M (decode) is latency-bound, where one launch beats cuBLAS +
NCCL's two. Crossovers: trident/ops/crossover.json (selector.py).
"""
from __future__ import annotations

import torch

from . import schedules
from ..runtime.compiled import STANDINS, is_compiling
from ..runtime.plans import Plan
from ._common import check_inputs, check_matrices, run, schedule_plan


def matmul_all_reduce(ctx, a, w, bias=None, out=None, schedule: str = "auto",
                      algorithm: str | None = None, **options) -> torch.Tensor:
    """all_reduce(a @ w.T) + bias -> [a.shape[0], w.shape[0]].

    schedule: "auto" (auto.py), "fused", "sequential" (cuBLAS, then trident's all_reduce),
    "epilogue" (one kernel: each GEMM program pushes its tile to every peer and sums the
    world's copies in rank order), "pipelined" or "plain" (also "nccl": cuBLAS + NCCL
    all-reduce); see schedules.py. algorithm: the older name of schedule. options go to
    the schedule (fused: config, split_k, gemm: "auto", "classic", "tma" or "gluon", see
    matmul_reduce_scatter.matmul_reduce_fused; sequential: collective; epilogue: config).
    """
    if is_compiling():             # torch.compile traces its stand-in (runtime/compiled.py)
        return STANDINS["matmul_all_reduce"](ctx, a, w, bias, out, schedule, algorithm, **options)
    name = schedules.normalize("matmul_all_reduce", schedule, algorithm, ctx)
    return run(ctx, "matmul_all_reduce", _plan, a, w, bias, out, name, options)


def _plan(ctx, a, w, bias, out, name, options) -> Plan:
    check_matrices(ctx, "matmul_all_reduce", a, w, bias, out)
    shape = (a.shape[0], w.shape[0])
    check_inputs(ctx, "matmul_all_reduce", a, w, bias, out, shape, empty_k=True)
    return schedule_plan(ctx, "matmul_all_reduce", a, w, bias, out, shape, name, options,
                         a.shape[0], w.shape[0], a.shape[1])
