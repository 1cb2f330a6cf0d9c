"""The fused ops under both GEMM cores in the same rank pool (TRIDENT_GEMM sets the default;
the gemm= option picks one per call and is part of the plan key): "classic" (one tile per
program, pointer loads) and "tma" (persistent programs over a tile queue, TMA loads where
the tensors allow). Small shapes: the interpreter is slow."""
import pytest
import torch

from trident.ops import _common, fused_tile
from trident.ops.all_gather_matmul import all_gather_matmul_fused
from trident.ops.matmul_reduce_scatter import matmul_reduce_fused
from trident.runtime.plans import Plan

from .reference import assert_close, make


def _launch_constexprs(ctx, build, tensors, **kw) -> dict:
    """The constexprs a fused op's plan launches with (a plan built here, run once)."""
    plan = Plan(tensors)
    build(ctx, plan, *tensors, **kw)
    kwargs = plan.steps[0].kwargs
    plan.finish()
    plan(tensors)
    return {k: kwargs[k] for k in ("PERSISTENT", "TMA", "BM", "BN", "BK")}


def _both_cores(ctx):
    world, rank = ctx.world_size, ctx.rank
    for call, gemm in enumerate(("tma", "classic", "tma")):
        seed = 100 * call
        # all_gather_matmul: K % 8 == 0 (TMA on the gathered rows), bias, odd M and N
        m_local, n, k = 13, 40, 48
        a_full = make((m_local * world, k), seed, torch.bfloat16, ctx.device)
        w = make((n, k), seed + 1 + rank, torch.bfloat16, ctx.device)
        bias = make((n,), seed + 2 + rank, torch.bfloat16, ctx.device)
        out = ctx.all_gather_matmul(a_full[rank * m_local:(rank + 1) * m_local], w, bias,
                                    algorithm="fused", gemm=gemm)
        assert_close(out, a_full.float() @ w.float().T + bias.float(), f"ag {gemm} {call}")
        # the row-parallel ops: a contiguous a (TMA) and a column slice of a wider one
        # whose rows are not 16-byte aligned (the pointer path)
        m, n, k_local = 8 * world + 3 * (world % 2), 40, 24 + 4 * (call % 2)
        a_full = make((m, k_local * world), seed + 3, torch.bfloat16, ctx.device)
        w_full = make((n, k_local * world), seed + 4, torch.bfloat16, ctx.device)
        cols = slice(rank * k_local, (rank + 1) * k_local)
        ref = a_full.float() @ w_full.float().T
        for a in (a_full[:, cols].contiguous(), a_full[:, cols]):
            w = w_full[:, cols].contiguous()
            got = ctx.matmul_all_reduce(a, w, algorithm="fused", gemm=gemm)
            assert_close(got, ref, f"ar {gemm} {call}")
            if m % world == 0:
                got = ctx.matmul_reduce_scatter(a, w, algorithm="fused", gemm=gemm)
                assert_close(got, ref.chunk(world)[rank], f"rs {gemm} {call}")
    ctx.sync()


def test_both_cores_same_pool(pool):
    pool.run(_both_cores)


def _paths(ctx):
    """Which path each core takes: classic = one tile per program, pointer loads; tma =
    persistent, TMA where K (gathered rows) and a/w allow, the pointer path otherwise."""
    world, rank = ctx.world_size, ctx.rank
    for k, tma_ok in ((32, True), (36, False)):      # 36: gathered row stride 72 bytes
        a = make((8, k), 1, torch.bfloat16, ctx.device)
        w = make((24, k), 2 + rank, torch.bfloat16, ctx.device)
        out = torch.empty(8 * world, 24, dtype=torch.bfloat16, device=ctx.device)
        for gemm in ("classic", "tma"):
            got = _launch_constexprs(ctx, all_gather_matmul_fused, (a, w, None, out), gemm=gemm)
            assert got["PERSISTENT"] == (gemm == "tma")
            assert got["TMA"] == (gemm == "tma" and tma_ok), (k, gemm, got)
    wide = make((4 * world, 64), 3, torch.bfloat16, ctx.device)
    w = make((16, 24), 4, torch.bfloat16, ctx.device)
    for a, tma_ok in ((wide[:, :24].contiguous(), True), (wide[:, 4:28], False)):
        out = torch.empty(4 * world, 16, dtype=torch.bfloat16, device=ctx.device)
        got = _launch_constexprs(ctx, matmul_reduce_fused, (a, w, None, out), all_reduce=True,
                                 gemm="tma")
        assert got["PERSISTENT"] and got["TMA"] == tma_ok
    ctx.sync()


def test_paths(pool):
    pool.run(_paths)


def _bad_core(ctx):
    a = torch.randn(4, 16, dtype=torch.bfloat16, device=ctx.device)
    w = torch.randn(8, 16, dtype=torch.bfloat16, device=ctx.device)
    with pytest.raises(ValueError, match="TRIDENT_GEMM"):
        ctx.all_gather_matmul(a, w, algorithm="fused", gemm="cutlass")


def test_bad_core(pool):
    pool.run(_bad_core)


def test_default_core():
    from trident.runtime import options
    assert options.variable("TRIDENT_GEMM").parse.shape == f"one of {_common.GEMM_MODES}"
    assert options.variable("TRIDENT_GEMM").default in _common.GEMM_MODES


def _auto_core(ctx):
    """gemm="auto" takes the tma core from TMA_MIN_M GEMM rows, the classic one below."""
    small = fused_tile.fused_gemm_config(ctx, _common.TMA_MIN_M - 1, 64, 64, "auto", None, 8, "K")
    large = fused_tile.fused_gemm_config(ctx, _common.TMA_MIN_M, 64, 64, "auto", None, 8, "K")
    return small["PERSISTENT"], large["PERSISTENT"]


def test_auto_core_by_rows(pool):
    assert pool.run(_auto_core)[0] == (False, True)
