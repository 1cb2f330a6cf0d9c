"""`trident bench ops`' rows of matmul_all_reduce_add_rmsnorm (row-parallel linear ->
all-reduce -> residual add -> RMSNorm: trident/ops/matmul_all_reduce_add_rmsnorm.py), on
the row-parallel layers, beside its baselines in the same run:
  trident_fused        schedule="fused": the one kernel (ops/epilogue_lamport.py), where it
                       takes the call (M <= 256, M x N in a Lamport slot), else "not run"
  trident_sequential   trident's matmul_all_reduce (auto), then torch's add and norm
  trident_auto         schedule="auto" (its choice in the table)
  cublas+ar_norm_lamport  torch.matmul, then ctx.all_reduce_add_rmsnorm(algorithm=
                       "lamport"): cuBLAS + trident's one-kernel all-reduce + add + norm
  plain                torch.matmul + NCCL all_reduce + torch add and rmsnorm
Each row owns a residual (the same values on every rank and row), updated in place by its
calls; its first call, the check, starts from the shared one, as does the reference. The
target (issue 39): the one kernel within TARGET_OVER_GEMM_US of cuBLAS alone (gemm_us) at
2 GPUs, M 1-128 (`targets`).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..ccl.add_rmsnorm import torch_add_rmsnorm
from . import common

NAME = "matmul_all_reduce_add_rmsnorm"
EPS = 1e-5
TARGET_OVER_GEMM_US = 5.0


def _norm_inputs(ctx, m: int, n: int):
    """(residual, norm weight): the same on every rank and at every call (seeded)."""
    g = torch.Generator(device=ctx.device).manual_seed(7)
    residual = torch.randn(m, n, generator=g, device=ctx.device).to(torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(n, generator=g, device=ctx.device)).to(torch.bfloat16)
    return residual, weight


def _add_norm(s, residual, weight):
    out = torch.empty(residual.shape, dtype=residual.dtype, device=residual.device)
    torch_add_rmsnorm(s, residual, weight, out, EPS)
    return out


def _plain(ctx, a, wt, residual, weight):
    p = torch.matmul(a, wt.t())
    dist.all_reduce(p, group=ctx.group)
    return _add_norm(p, residual, weight)


def impls(ctx, a, wt, only=None) -> dict:
    """name -> (callable or None, why not), the plain baseline last (bench ops' _impls)."""
    from ..ccl import lamport
    from ..ops.matmul_all_reduce_add_rmsnorm import why_not
    m, n = a.shape[0], wt.shape[0]
    res0, weight = _norm_inputs(ctx, m, n)
    op = ctx.matmul_all_reduce_add_rmsnorm

    def row(schedule):
        r = res0.clone()
        # the default form: a new res per call, residual left as it is
        return (lambda: op(a, wt, r, weight, EPS, schedule=schedule)[0]), None

    why = why_not(ctx, m, n, a.element_size())
    out = {"trident_fused": row("fused") if why is None else (None, f"one kernel: {why}"),
           "trident_sequential": row("sequential"), "trident_auto": row("auto")}
    r_lamport = res0.clone()
    out["cublas+ar_norm_lamport"] = (None, "past the Lamport buffers' capacity") \
        if m * n * a.element_size() > lamport.slot_bytes(ctx) else (
            lambda: ctx.all_reduce_add_rmsnorm(torch.matmul(a, wt.t()), r_lamport, weight,
                                               EPS, algorithm="lamport"), None)
    r_plain = res0.clone()
    out["plain"] = ((lambda: _plain(ctx, a, wt, r_plain, weight)), None) \
        if common.nccl_runs(ctx) else (None, common.NO_NCCL)
    return out if only is None else {k: v for k, v in out.items() if k in only or k == "plain"}


def reference(ctx, a, wt):
    """(this rank's reference out from the shared residual, what it is): the plain path's
    where NCCL runs, else torch on partial products summed in fp32 by trident's
    all_reduce."""
    residual, weight = _norm_inputs(ctx, a.shape[0], wt.shape[0])
    if common.nccl_runs(ctx):
        return _plain(ctx, a, wt, residual, weight), "plain"
    s = ctx.all_reduce(torch.matmul(a.float(), wt.float().t()))
    return _add_norm(s, residual, weight), "torch+trident collectives"


def choice(ctx, m: int, n: int) -> str:
    """'eager / graph': the schedule auto takes (the same in both modes)."""
    from ..ops.matmul_all_reduce_add_rmsnorm import resolve
    name = resolve(ctx, "auto", m, n, torch.bfloat16.itemsize)
    return f"{name} / {name}"


def targets(rows: list[dict], mode: str) -> dict:
    """The one kernel against cuBLAS alone + TARGET_OVER_GEMM_US at M 1-128 (`mode`'s
    times), each miss with its figure."""
    over, misses = [], []
    for r in rows:
        if r["op"] != NAME or r["impl"] != "trident_fused" or not 1 <= r["M"] <= 128:
            continue
        t, gemm = r.get(f"{mode}_us"), r.get("gemm_us")
        if t and gemm:
            case = f"{r['model']} {r['layer']} M={r['M']}: {t:.1f} us, cuBLAS {gemm:.1f}"
            over.append(case)
            if t - gemm > TARGET_OVER_GEMM_US:
                misses.append(case)
    return {"norm_cases": len(over), "norm_misses": misses}
