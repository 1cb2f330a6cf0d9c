"""matmul_all_reduce: out [M, N] = all_reduce(a @ w.T) + bias (row-parallel linear whose
output every rank needs). a: [M, K_local], w: [N, K_local], bias: [N] added once.

The kernel is matmul_reduce_scatter's (see there) with tiles owned round-robin by the
ranks and a third role: each owner reduces its tiles, keeps them in a heap buffer and
flags them on every rank; gather programs pull the tiles of the other owners into `out`.
Every rank gets bitwise the same result (one rank sums each tile, in rank order). M need
not be divisible by the world size.

When it wins: like matmul_reduce_scatter, with twice the traffic (reduce-scatter then
all-gather of M*N); small M (decode) is latency-bound, where one launch beats cuBLAS +
NCCL's two. Crossovers: trident/ops/crossover.json (selector.py).
"""
from __future__ import annotations

import torch

from . import plain, selector
from ._common import check_inputs, check_same_on_all_ranks
from .matmul_reduce_scatter import matmul_reduce_fused


def matmul_all_reduce(ctx, a, w, bias=None, out=None, algorithm: str = "auto",
                      **options) -> torch.Tensor:
    """all_reduce(a @ w.T) + bias -> [a.shape[0], w.shape[0]].

    algorithm: "auto" (the selector), "fused" or "plain" (cuBLAS + NCCL all-reduce).
    """
    if not isinstance(a, torch.Tensor) or a.dim() != 2:
        check_inputs(ctx, "matmul_all_reduce", a, w, bias, out, ())
    out = check_inputs(ctx, "matmul_all_reduce", a, w, bias, out, (a.shape[0], w.shape[0]))
    check_same_on_all_ranks(ctx, "matmul_all_reduce", (tuple(a.shape), w.shape[0], str(a.dtype)))
    path = selector.resolve(ctx, "matmul_all_reduce", algorithm, a.shape[0], w.shape[0],
                            a.shape[1])
    if path == "plain":
        return plain.matmul_all_reduce(ctx, a, w, bias, out)
    if out is None:
        out = torch.empty(a.shape[0], w.shape[0], dtype=a.dtype, device=a.device)
    return matmul_reduce_fused(ctx, a, w, bias, out, all_reduce=True, **options)
