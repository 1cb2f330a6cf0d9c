"""The fused ops under every GEMM core in the same rank pool (TRIDENT_GEMM sets the default;
the gemm= option picks one per call and is part of the plan key): "classic" (one tile per
program, pointer loads), "tma" (persistent programs over a tile queue, TMA loads where
the tensors allow) and "gluon" (the warp-specialised Gluon kernels on sm_90 GPUs; "tma"
elsewhere, the CPU emulation included; the row-parallel ops' Gluon kernel on GPUs:
test_rowpar_gluon.py). Small shapes: the interpreter is
slow."""
import pytest
import torch

from trident.ops import _common, fused_gluon, fused_tile
from trident.ops.all_gather_matmul import all_gather_matmul_fused
from trident.ops.matmul_reduce_scatter import matmul_reduce_fused
from trident.runtime.plans import Plan

from .reference import assert_close, make


def _launch_constexprs(ctx, build, tensors, **kw) -> dict:
    """The constexprs a fused op's plan launches with (a plan built here, run once), and
    "gluon": whether the kernel is fused_gluon.py's."""
    plan = Plan(tensors)
    build(ctx, plan, *tensors, **kw)
    step = plan.steps[0]
    plan.finish()
    plan(tensors)
    if step.kernel is fused_gluon._all_gather_matmul_gluon_kernel:
        return dict(gluon=True, PERSISTENT=True, TMA=True)
    return dict({k: step.kwargs[k] for k in ("PERSISTENT", "TMA", "BM", "BN", "BK")},
                gluon=False)


def _both_cores(ctx):
    world, rank = ctx.world_size, ctx.rank
    for call, gemm in enumerate(("tma", "classic", "gluon", "tma")):
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
        for gemm in ("classic", "tma", "gluon"):
            got = _launch_constexprs(ctx, all_gather_matmul_fused, (a, w, None, out), gemm=gemm)
            assert got["PERSISTENT"] == (gemm != "classic")
            assert got["TMA"] == (gemm != "classic" and tma_ok), (k, gemm, got)
            # gluon: its kernel where it runs (sm_90, K % 8 == 0), else the tma core's
            assert got["gluon"] == (gemm == "gluon" and fused_tile.gluon_runs(ctx, k)), got
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
    for misspelt in ("cutlass", "Gluon", "glu"):
        with pytest.raises(ValueError, match="TRIDENT_GEMM"):
            ctx.all_gather_matmul(a, w, algorithm="fused", gemm=misspelt)
    # the gluon core runs no swap-AB config: said so, on every backend
    with pytest.raises(ValueError, match="gluon GEMM core runs no swap-AB"):
        ctx.all_gather_matmul(a, w, algorithm="fused", gemm="gluon",
                              config={"SWAP_AB": True})


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


def _gluon_choice(ctx):
    """"auto" never takes the gluon core (not measured); "gluon" runs where gluon_runs
    says (an sm_90 GPU; all_gather_matmul also K % 8 == 0, the row-parallel ops whatever
    each rank's K), "tma" elsewhere; its per-rank fallback keeps the BM every rank flags."""
    cores = set()
    for m in (16, 256, _common.TMA_MIN_M, 16384):
        for local in ("N", "K"):
            cfg = fused_tile.fused_gemm_config(ctx, m, 4096, 4096, "auto", None, 8, local,
                                               gluon=True)
            cores.add(cfg["CORE"])
    runs = fused_tile.gluon_runs(ctx, 4096)
    ag = fused_tile.fused_gemm_config(ctx, 1024, 4096, 4096, "gluon", None, 8, "N", gluon=True)
    rs = fused_tile.fused_gemm_config(ctx, 1024, 4096, 4092, "gluon", None, 8, "K",
                                      gluon=True)
    odd_k = fused_tile.fused_gemm_config(ctx, 1024, 4096, 4092, "gluon", None, 8, "N",
                                         gluon=True)
    fallback = ag.get("FALLBACK", ag)
    return (cores, runs, ag["CORE"], rs["CORE"], odd_k["CORE"], fallback["BM"] == ag["BM"],
            fallback["CORE"])


def test_gluon_core_choice(pool):
    cores, runs, ag, rs, odd_k, same_bm, fallback = pool.run(_gluon_choice)[0]
    assert "gluon" not in cores, cores
    assert ag == rs == ("gluon" if runs else "tma") and odd_k == "tma"
    assert same_bm and fallback == "tma"


def test_gluon_twins_keep_the_row_block():
    """A gluon config's per-rank fallback (a w TMA cannot address) is its TWIN with the
    same BM, so that the rank still pushes and flags the blocks its peers wait for: every
    Gluon candidate's twin has that BM already."""
    from trident.ops import gemm
    for name, cfg in gemm.KNOWN.items():
        if cfg.get("GLUON"):
            assert gemm.resolve(cfg["TWIN"])["BM"] == cfg["BM"], name
