"""The fused ops with the GEMM core's small-M configs (trident/ops/fused_tile.py): swap-AB
(the tile computed as w @ a.T and transposed) and deterministic split-K (a tile is pushed,
flagged or stored only once its last slice summed it), forced through the config= and
split_k= options, on both cores (classic: one program per work unit; tma: persistent
programs over the queue, TMA loads where aligned). Against a float64 torch reference on
the gathered inputs: M = 1, M and N not multiples of the tile, K shorter than one BK step
or not a multiple of it, more slices than K steps, a rank with an empty K shard, bias on
and off. Also: "auto" takes the table's small-M entry on the tma core, and reads the
table without the size that may differ between ranks."""
import types

import pytest
import torch

from trident.ops import _common, fused_tile, gemm
from trident.ops.matmul_reduce_scatter import matmul_reduce_fused
from trident.runtime.plans import Plan

from .reference import assert_close, make

# (swap-AB, exact K slices per tile): one slice, two, and three (more than some Ks' steps)
VARIANTS = [(False, 2), (True, 1), (True, 3)]


def _opts(gemm_core, swap, split):
    return dict(algorithm="fused", gemm=gemm_core, config={"SWAP_AB": swap}, split_k=split)


def _row_parallel(ctx, op, m, n, k_locals, with_bias, gemm_core):
    """Rank r holds k_locals[r] columns of A and W (row-parallel); every variant, two calls
    each (new data; the second reuses the plan, the split-K counters must be back at 0)."""
    world, rank = ctx.world_size, ctx.rank
    ks = [k_locals[r % len(k_locals)] for r in range(world)]
    lo, hi = sum(ks[:rank]), sum(ks[:rank + 1])
    for swap, split in VARIANTS:
        for call in range(2):
            seed = 7 * m + n + 100 * call + 10 * split + swap
            a_full = make((m, sum(ks)), seed, torch.bfloat16, ctx.device)
            w_full = make((n, sum(ks)), seed + 1, torch.bfloat16, ctx.device)
            bias = make((n,), seed + 2, torch.bfloat16, ctx.device) if with_bias else None
            a, w = a_full[:, lo:hi].contiguous(), w_full[:, lo:hi].contiguous()
            ref = a_full.double() @ w_full.double().T
            if with_bias:
                ref += bias.double()
            what = f"{op} {gemm_core} M={m} N={n} K={ks} swap={swap} split={split} call {call}"
            if op == "matmul_reduce_scatter":
                out = ctx.matmul_reduce_scatter(a, w, bias, **_opts(gemm_core, swap, split))
                assert_close(out, ref.chunk(world)[rank], what)
            else:
                out = ctx.matmul_all_reduce(a, w, bias, **_opts(gemm_core, swap, split))
                assert_close(out, ref, what)
                everyone = [torch.empty_like(out) for _ in range(world)]
                torch.distributed.all_gather(everyone, out, group=ctx.group)
                assert all(torch.equal(everyone[0], o) for o in everyone), what
    ctx.sync()
    assert all(int(c.abs().sum()) == 0 for c in _common.split_counters(ctx))


@pytest.mark.parametrize("gemm_core", ["tma", "classic"])
@pytest.mark.parametrize("m,n,k_locals,with_bias", [
    (1, 40, (64,), True),            # M = 1; K two BK steps
    (37, 45, (72, 8), False),        # odd N (pointer path); K 72 and 8 (< one BK step)
    (50, 64, (40, 0), True),         # a rank with an empty K shard
])
def test_all_reduce_small_m(pool, m, n, k_locals, with_bias, gemm_core):
    pool.run(_row_parallel, "matmul_all_reduce", m, n, k_locals, with_bias, gemm_core)


@pytest.mark.parametrize("gemm_core", ["tma", "classic"])
@pytest.mark.parametrize("m_local,n,k_locals,with_bias", [
    (1, 40, (96,), False),           # one row per rank
    (13, 45, (72, 8), True),         # owner rows not a multiple of either tile's rows
    (5, 64, (40,), True),
])
def test_reduce_scatter_small_m(pool, m_local, n, k_locals, with_bias, gemm_core):
    pool.run(_row_parallel, "matmul_reduce_scatter", m_local * pool.world_size, n, k_locals,
             with_bias, gemm_core)


def _all_gather(ctx, m_local, n, k, with_bias, gemm_core):
    """Each rank's own N (n + 8 * rank columns of W): only the row blocks are shared."""
    world, rank = ctx.world_size, ctx.rank
    for swap, split in VARIANTS:
        for call in range(2):
            seed = 11 * m_local + n + k + 100 * call + 10 * split + swap
            a_full = make((m_local * world, k), seed, torch.bfloat16, ctx.device)
            w = make((n + 8 * rank, k), seed + 1 + rank, torch.bfloat16, ctx.device)
            bias = make((n + 8 * rank,), seed + 2 + rank, torch.bfloat16, ctx.device) \
                if with_bias else None
            a = a_full[rank * m_local:(rank + 1) * m_local]
            out = ctx.all_gather_matmul(a, w, bias, **_opts(gemm_core, swap, split))
            ref = a_full.double() @ w.double().T
            if with_bias:
                ref += bias.double()
            assert_close(out, ref, f"ag {gemm_core} m_local={m_local} N={w.shape[0]} K={k} "
                                   f"swap={swap} split={split} call {call}")
    ctx.sync()
    assert all(int(c.abs().sum()) == 0 for c in _common.split_counters(ctx))


@pytest.mark.parametrize("gemm_core", ["tma", "classic"])
@pytest.mark.parametrize("m_local,n,k,with_bias", [
    (1, 40, 64, True),               # M = world rows; K % 8 == 0: TMA on the tma core
    (13, 45, 72, False),             # row blocks straddle ranks; K not a multiple of BK
    (5, 24, 20, True),               # K < BK: TMA off (gathered rows of 40 bytes)
])
def test_all_gather_matmul_small_m(pool, m_local, n, k, with_bias, gemm_core):
    pool.run(_all_gather, m_local, n, k, with_bias, gemm_core)


def _deterministic_and_launched(ctx):
    """Split-K sums slices in slice order: the same call gives bitwise the same result;
    the launch carries the op's tile (transposed config tile under swap-AB) and SPLIT."""
    world = ctx.world_size
    a = make((6 * world, 160), 3 + ctx.rank, torch.bfloat16, ctx.device)
    w = make((72, 160), 4 + ctx.rank, torch.bfloat16, ctx.device)
    opts = _opts("tma", True, 3)
    first = ctx.matmul_all_reduce(a, w, **opts)
    for _ in range(2):
        assert torch.equal(ctx.matmul_all_reduce(a, w, **opts), first)
    out = torch.empty(6 * world, 72, dtype=torch.bfloat16, device=ctx.device)
    tensors = (a, w, None, out)
    plan = Plan(tensors)
    matmul_reduce_fused(ctx, plan, *tensors, all_reduce=True, gemm="tma",
                        config={"SWAP_AB": True}, split_k=3)
    kw = plan.steps[0].kwargs
    plan.finish()
    plan(tensors)
    assert (kw["SWAP_AB"], kw["SPLIT"]) == (True, True)
    if ctx.backend == "cpu":       # the tile is known there; on GPUs it comes from the table
        core = gemm.INTERPRET_CONFIG
        assert (kw["BM"], kw["BN"]) == (core["BN"], core["BM"])
    ctx.sync()


def test_deterministic_and_launched(pool):
    pool.run(_deterministic_and_launched)


def test_bad_split(pool):
    pool.run(_bad_split)


def _bad_split(ctx):
    a = make((2 * ctx.world_size, 32), 1, torch.bfloat16, ctx.device)
    w = make((16, 32), 2, torch.bfloat16, ctx.device)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="split_k must be a positive int"):
            ctx.matmul_all_reduce(a, w, algorithm="fused", split_k=bad)


# ---------------------------------------------------------------------------- selection
CPU = types.SimpleNamespace(backend="cpu", usable_sms=132)
SWAB = gemm.CANDIDATES["swab128x64x64_s6_w4_sk8"]


def _fake_table(monkeypatch, entry):
    """gemm.config_for returns `entry` (as on a GPU with that table) and records its
    arguments."""
    seen = []

    def config_for(M, N, K, split_k=False, gpu=None):
        seen.append((M, N, K, split_k))
        return gemm.resolve(entry)
    monkeypatch.setattr(gemm, "config_for", config_for)
    return seen


def test_auto_takes_small_m_entry(monkeypatch):
    seen = _fake_table(monkeypatch, SWAB)
    cfg = fused_tile.fused_gemm_config(CPU, 64, 8192, 4096, "auto", None, 1, "K")
    assert cfg["PERSISTENT"] and cfg["SWAP_AB"] and cfg["SPLIT_K"] == 8
    assert fused_tile.tile_shape(cfg) == (SWAB["BN"], SWAB["BM"])
    # the row-parallel ops read the table without their K, all_gather_matmul without N
    assert seen[-1] == (64, 8192, fused_tile.ANY, True)
    fused_tile.fused_gemm_config(CPU, 64, 5120, 8192, "auto", None, 8, "N")
    assert seen[-1] == (64, fused_tile.ANY, 8192, True)
    # config= overrides; "classic" keeps the classic tiles and neither switch
    cfg = fused_tile.fused_gemm_config(CPU, 64, 8192, 4096, "auto", {"SWAP_AB": False},
                                       1, "K")
    assert not cfg["SWAP_AB"] and cfg["PERSISTENT"]
    cfg = fused_tile.fused_gemm_config(CPU, 64, 8192, 4096, "classic", None, 1, "K")
    assert not cfg["PERSISTENT"] and not cfg["SWAP_AB"] and cfg["SPLIT_K"] == 1
    with pytest.raises(ValueError, match="local"):
        fused_tile.fused_gemm_config(CPU, 64, 64, 64, "auto", None, 1, "M")


def test_auto_keeps_classic_for_plain_entry(monkeypatch):
    _fake_table(monkeypatch, "64x128x64_s4_w4")
    small = fused_tile.fused_gemm_config(CPU, 64, 8192, 4096, "auto", None, 1, "K")
    large = fused_tile.fused_gemm_config(CPU, _common.TMA_MIN_M, 8192, 4096, "auto", None,
                                         1, "K")
    assert not small["PERSISTENT"] and large["PERSISTENT"]


def test_tiles_and_split_choice():
    """The op's tile count follows its tile of out; split_for_tiles agrees with the core's
    split_k_for on the same tiles (a swap-AB config tiles N with BM)."""
    cfg = dict(SWAB, SWAP_AB=True)
    assert fused_tile.num_tiles("matmul_all_reduce", 64, 8192, 2, cfg) == 8192 // 128
    assert fused_tile.num_tiles("all_gather_matmul", 64, 8192, 2, cfg) == 8192 // 128
    assert fused_tile.num_tiles("matmul_reduce_scatter", 64, 8192, 2, cfg) == 2 * 64
    assert gemm.split_for_tiles(64, 8192, cfg, 132) == gemm.split_k_for(64, 8192, 8192, cfg,
                                                                        132) > 1
    assert gemm.split_for_tiles(64, 0, cfg, 132) == 1          # an empty K shard
