"""matmul_reduce_scatter and matmul_all_reduce on the "gluon" GEMM core of their fused
schedule (trident/ops/matmul_reduce_gluon.py: warp-specialised Gluon GEMM programs, the
Triton reducers and gather programs) on sm_90 GPUs: against torch at odd and even shapes
(M no multiple of the tile, several N and K, split-K), bias or none, bf16 and fp16; the
all-reduce bitwise the same on every rank and as the "tma" core's with the same tiles
(within bf16 rounding: same reduction order); a rank whose a TMA cannot address (its
per-rank fallback, the "tma" kernel) and a rank on gemm="tma" with the same tiles beside
one on gluon; ranks whose tile order differs refused; a CUDA-graph replay; a peer that
never arrives (poisoned output, then CommTimeout). Where the gluon core cannot run (the
CPU emulation, other GPUs) these are skipped: there gemm="gluon" runs the "tma" core,
which test_fused_gemm_core.py checks. The config logic that needs no GPU is at the end."""
import pytest
import torch

from trident.ops import fused_tile, matmul_reduce_gluon
from trident.ops.matmul_reduce_scatter import matmul_reduce_fused
from trident.runtime.errors import CallMismatch, CommTimeout, PeerFailed
from trident.runtime.plans import Plan

from ..conftest import BACKEND, WORLD_SIZES
from ..faults.test_no_silent_garbage import SHORT, check_last_rank_skipped, last_rank_skips
from .reference import assert_close, make

ON_HOPPER = (BACKEND == "cuda" and torch.cuda.is_available()
             and torch.cuda.get_device_capability() == (9, 0))
gpu = pytest.mark.skipif(not ON_HOPPER, reason="the gluon core runs on sm_90 GPUs only")
MULTI = [w for w in WORLD_SIZES if w >= 2] or [2]
FAILED = (CallMismatch.__name__, CommTimeout.__name__, PeerFailed.__name__)


@pytest.fixture(params=MULTI, ids=lambda w: f"world{w}")
def mpool(request):
    from ..conftest import get_pool
    return get_pool(request.param)


def _shards(ctx, m, n, k, seed, dtype, bias):
    """This rank's columns of A [m, world*k] and W [n, world*k], the bias (the same on
    every rank) and the fp32 reference of all_reduce(a @ w.T) + bias."""
    world, rank = ctx.world_size, ctx.rank
    a_full = make((m, world * k), seed, dtype, ctx.device)
    w_full = make((n, world * k), seed + 1, dtype, ctx.device) / (world * k) ** 0.5
    b = make((n,), seed + 2, dtype, ctx.device) if bias else None
    cols = slice(rank * k, (rank + 1) * k)
    ref = a_full.float() @ w_full.float().T + (b.float() if bias else 0)
    return a_full[:, cols].contiguous(), w_full[:, cols].contiguous(), b, ref, a_full, cols


def _kernel_of(ctx, a, w, all_reduce, **kw):
    """The kernel a fused plan of (a, w) launches (the plan built here and run once)."""
    out = torch.empty(a.shape[0] // (1 if all_reduce else ctx.world_size), w.shape[0],
                      dtype=a.dtype, device=ctx.device)
    tensors = (a, w, None, out)
    plan = Plan(tensors)
    matmul_reduce_fused(ctx, plan, *tensors, all_reduce=all_reduce, **kw)
    step = plan.steps[0]
    plan.finish()
    plan(tensors)
    return step.kernel


def _same_on_every_rank(ctx, out) -> bool:
    """Whether `out` has the same bits on every rank (an all-gather of its raw words)."""
    words = out.contiguous().view(torch.int16).flatten()
    every = torch.empty(ctx.world_size * words.numel(), dtype=torch.int16, device=ctx.device)
    ctx.all_gather(every, words)
    return all(torch.equal(every.view(ctx.world_size, -1)[r], words)
               for r in range(ctx.world_size))


# (M, N, K per rank, split_k or None): M no multiple of 64/128 (rows past the tile), N odd
# multiples of 8, K tails of BK, several tiles per program, a split-K case at small M
SHAPES = [(8 * 39, 264, 200, None), (2 * 128 * 4, 1024, 512, None), (2 * 75, 136, 1000, None),
          (2 * 64, 520, 1024, 3), (2 * 300, 200, 72, None), (2 * 16, 256, 4096, 4)]


def _values(ctx, dtype):
    world, rank = ctx.world_size, ctx.rank
    gluon = matmul_reduce_gluon._matmul_reduce_gluon_kernel
    for call, (m, n, k, split_k) in enumerate(SHAPES):
        m = m // 2 * world               # divisible by the world size (reduce-scatter)
        a, w, b, ref, _, _ = _shards(ctx, m, n, k, 10 * call, dtype, call % 2 == 0)
        opts = {} if split_k is None else {"split_k": split_k}
        assert _kernel_of(ctx, a, w, True, gemm="gluon", **opts) is gluon
        for repeat in range(2):          # the second call reuses plan, flags and slots
            what = f"rank {rank} {dtype} {(m, n, k, split_k)} call {repeat}"
            ar = ctx.matmul_all_reduce(a, w, b, schedule="fused", gemm="gluon", **opts)
            assert_close(ar, ref, f"matmul_all_reduce {what}")
            assert _same_on_every_rank(ctx, ar), f"matmul_all_reduce differs across ranks {what}"
            rs = ctx.matmul_reduce_scatter(a, w, b, schedule="fused", gemm="gluon", **opts)
            assert_close(rs, ref.chunk(world)[rank], f"matmul_reduce_scatter {what}")
        # the "tma" core with the gluon config's tiles: the same partials, summed in the
        # same order (fp32 accumulation of the same K steps)
        cfg = fused_tile.fused_gemm_config(ctx, m, n, k, "gluon", None, 1, "K", gluon=True)
        tiles = {key: cfg[key] for key in ("BM", "BN", "BK", "GROUP_M")}
        tma = ctx.matmul_all_reduce(a, w, b, schedule="fused", gemm="tma", config=tiles,
                                    **opts)
        assert_close(ar, tma.float(), f"gluon against tma, {(m, n, k)}", rel=5e-3)
    ctx.sync()


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gluon_core_values(mpool, dtype):
    mpool.run(_values, dtype)


def _mixed_kernels(ctx):
    """The last rank's a is a column slice whose rows TMA cannot address: that rank runs
    the "tma" kernel (FALLBACK: the same tiles and order), its peers the gluon one; then
    rank 0 on gemm="tma" with the gluon config's tiles, the others on gluon. Both right."""
    world, rank = ctx.world_size, ctx.rank
    m, n, k = 96 * world, 200, 104      # K rows of 208 bytes: TMA can address w
    a, w, b, ref, a_full, cols = _shards(ctx, m, n, k, 7, torch.bfloat16, True)
    if rank == world - 1:
        wide = torch.zeros(m, k + 4, dtype=a.dtype, device=ctx.device)
        wide[:, 4:] = a_full[:, cols]
        a = wide[:, 4:]                          # rows 8 bytes off 16-byte alignment
    gluon = matmul_reduce_gluon._matmul_reduce_gluon_kernel
    assert (_kernel_of(ctx, a, w, True, gemm="gluon") is gluon) == (rank != world - 1)
    for op in ("matmul_all_reduce", "matmul_reduce_scatter"):
        out = getattr(ctx, op)(a, w, b, schedule="fused", gemm="gluon")
        assert_close(out, ref if op == "matmul_all_reduce" else ref.chunk(world)[rank],
                     f"{op}, rank {rank} of mixed kernels")
    cfg = fused_tile.fused_gemm_config(ctx, m, n, k, "gluon", None, 1, "K", gluon=True)
    tiles = {key: cfg[key] for key in ("BM", "BN", "BK", "GROUP_M")}
    a = a.contiguous()
    out = ctx.matmul_all_reduce(a, w, b, schedule="fused", gemm="tma" if rank == 0 else "gluon",
                                config=tiles)
    assert_close(out, ref, f"rank {rank}: rank 0 on tma, the others on gluon")
    assert _same_on_every_rank(ctx, out)
    ctx.sync()


@gpu
def test_gluon_and_tma_ranks_interoperate(mpool):
    mpool.run(_mixed_kernels)


def _order_differs(ctx):
    """Rank 0 on gluon with GROUP_M 8, the others on tma with GROUP_M 1 and the same tiles:
    the same slots would hold different tiles, so the fingerprints differ -- refused
    (outputs poisoned, an error raised), never summed."""
    world = ctx.world_size
    m, n, k = 256 * world, 512, 128
    a, w, _, ref, _, _ = _shards(ctx, m, n, k, 9, torch.bfloat16, False)
    cfg = fused_tile.fused_gemm_config(ctx, m, n, k, "gluon", None, 1, "K", gluon=True)
    tiles = {key: cfg[key] for key in ("BM", "BN", "BK")}

    def call(mine):
        return ctx.matmul_all_reduce(a, w, schedule="fused", gemm=mine[0],
                                     config=dict(tiles, GROUP_M=mine[1]))
    for mine in (("gluon", 8), ("tma", 1)):          # compile both first, on every rank
        assert_close(call(mine), ref, f"{mine} alone")
    ctx.sync()
    timeout = ctx.timeout_s
    ctx.set_timeout(SHORT)
    try:
        out = call(("gluon", 8) if ctx.rank == 0 else ("tma", 1))
        try:
            ctx.sync()
            kind = None
        except Exception as exc:                      # noqa: BLE001 -- inspected below
            kind = type(exc).__name__
        poisoned = bool(out.isnan().any())
        ctx.reset()
    finally:
        ctx.set_timeout(timeout)
    assert_close(call(("gluon", 8)), ref, "after reset")
    return kind, poisoned


@gpu
def test_ranks_whose_tile_order_differs_are_refused(mpool):
    for rank, (kind, poisoned) in enumerate(mpool.run(_order_differs)):
        assert kind in FAILED and poisoned, (rank, kind, poisoned)


def _replayed(ctx):
    """Each op on the gluon core captured into a CUDA graph after an eager warm-up, then
    replayed on new inputs copied into the captured tensors: right every replay."""
    world, rank = ctx.world_size, ctx.rank
    m, n, k = 136 * world, 264, 200
    for op in ("matmul_all_reduce", "matmul_reduce_scatter"):
        a, w, b, _, _, _ = _shards(ctx, m, n, k, 1, torch.bfloat16, True)
        out = getattr(ctx, op)(a, w, b, schedule="fused", gemm="gluon")    # plan, workspace
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            getattr(ctx, op)(a, w, b, out=out, schedule="fused", gemm="gluon")
        torch.cuda.current_stream().wait_stream(side)
        ctx.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            getattr(ctx, op)(a, w, b, out=out, schedule="fused", gemm="gluon")
        for seed in (3, 4):
            a.copy_(_shards(ctx, m, n, k, seed, torch.bfloat16, True)[0])
            ref = _ref_with(ctx, seed, m, n, k)        # A of `seed`, W and bias as captured
            ctx.barrier()
            graph.replay()
            torch.cuda.synchronize()
            want = ref if op == "matmul_all_reduce" else ref.chunk(world)[rank]
            assert_close(out, want, f"{op} replayed from a CUDA graph, seed {seed}")
        ctx.barrier()
        del graph
    ctx.sync()


def _ref_with(ctx, seed, m, n, k):
    """The reference of A of `seed` with W and bias of seed 1 (_shards' tensors)."""
    world = ctx.world_size
    a_full = make((m, world * k), seed, torch.bfloat16, ctx.device)
    w_full = make((n, world * k), 2, torch.bfloat16, ctx.device) / (world * k) ** 0.5
    b = make((n,), 3, torch.bfloat16, ctx.device)
    return a_full.float() @ w_full.float().T + b.float()


@gpu
def test_gluon_core_replayed_from_a_cuda_graph(mpool):
    mpool.run(_replayed)


def _peer_never_arrives(ctx, op):
    """The last rank skips a call (never pushes its partials). On every other rank the
    output is poisoned (every tile needs that rank's partial) and the next call raises
    at once. Every rank compiled and ran the call once first."""
    def call():
        a = torch.ones(64 * ctx.world_size, 32, dtype=torch.bfloat16, device=ctx.device)
        w = torch.ones(136, 32, dtype=torch.bfloat16, device=ctx.device)
        return getattr(ctx, op)(a, w, schedule="fused", gemm="gluon")

    return last_rank_skips(ctx, call)


@gpu
@pytest.mark.parametrize("op", ["matmul_reduce_scatter", "matmul_all_reduce"])
def test_a_peer_that_never_arrives_is_poisoned(mpool, op):
    check_last_rank_skipped(mpool.run(_peer_never_arrives, op), op,
                            "the missing peer's tiles")


# ---------------------------------------------------------------------------- no GPU needed
class _Ctx:
    """What fused_gemm_config reads of a context when the core is named."""
    class options:
        gemm = "auto"


def test_row_parallel_fallback_keeps_the_tiles_and_their_order(monkeypatch):
    """Where gluon runs, a row-parallel rank that falls back (an a or w TMA cannot
    address) runs FALLBACK: the Triton twin with the gluon config's BM, BN and GROUP_M --
    the slots every rank exchanges -- even where the twin's own BN differs
    (ws64x64x128_s6_w4's twin is 64x128); all_gather_matmul's keeps only BM."""
    from trident.ops import gemm
    monkeypatch.setattr(fused_tile, "gluon_runs", lambda ctx, k: True)
    entry = gemm.resolve("ws64x64x128_s6_w4")
    monkeypatch.setattr(gemm, "config_for", lambda *a, **kw: dict(entry))
    rs = fused_tile.fused_gemm_config(_Ctx, 1024, 4096, 4096, "gluon", None, 1, "K",
                                      gluon=True)
    assert rs["CORE"] == "gluon" and rs["FALLBACK"]["CORE"] == "tma"
    assert [rs["FALLBACK"][k] for k in ("BM", "BN", "GROUP_M")] == \
        [rs[k] for k in ("BM", "BN", "GROUP_M")]
    ag = fused_tile.fused_gemm_config(_Ctx, 1024, 4096, 4096, "gluon", None, 8, "N",
                                      gluon=True)
    assert ag["FALLBACK"]["BM"] == ag["BM"]
    with pytest.raises(ValueError, match="gluon GEMM core runs no swap-AB"):
        fused_tile.fused_gemm_config(_Ctx, 64, 4096, 4096, "gluon", {"SWAP_AB": True}, 1,
                                     "K", gluon=True)


def test_row_parallel_gluon_ignores_each_ranks_k(monkeypatch):
    """The row-parallel ops' K is each rank's shard: whether the gluon core runs may not
    depend on it (a K % 8 != 0 on one rank alone would change that rank's tiles)."""
    seen = []
    monkeypatch.setattr(fused_tile, "gluon_runs", lambda ctx, k: seen.append(k) or False)
    fused_tile.fused_gemm_config(_Ctx, 1024, 4096, 4092, "gluon", None, 1, "K", gluon=True)
    fused_tile.fused_gemm_config(_Ctx, 1024, 4096, 4092, "gluon", None, 8, "N", gluon=True)
    assert seen == [None, 4092]
