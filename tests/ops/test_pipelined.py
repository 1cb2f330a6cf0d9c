"""The `pipelined` schedule (trident/ops/pipelined.py): cuBLAS per chunk of M while the
chunk's transfer runs on a second stream. Against an fp64 torch reference on the
gathered inputs, at every test world size, in one run per world: odd M, N and K, M = 1,
bias (bf16 and fp32) on and off, `out` given (with a row stride), a rank with an empty K
shard, back-to-back calls of other shapes and repeated calls of one plan (the epochs
advance, buffers are reused). Also: a call whose sizes differ across ranks is poisoned and
the next call raises on every rank (the issue-29 contract); through the ops' `schedule=`
(ctx.<op>(..., schedule="pipelined"))."""
import pytest
import torch

from trident.runtime.errors import CallMismatch, PeerFailed

from ..conftest import WORLD_SIZES
from .reference import assert_close, make


def _schedule_call(ctx, op, a, w, bias=None, out=None):
    return getattr(ctx, op)(a, w, bias, out=out, schedule="pipelined")


def _all_gather(ctx, m_local, n, k, bias_dtype, give_out, seed):
    world, rank = ctx.world_size, ctx.rank
    a_full = make((m_local * world, k), seed, torch.bfloat16, ctx.device)
    w = make((n + rank, k), seed + 1 + rank, torch.bfloat16, ctx.device)   # N per rank
    bias = make((n + rank,), seed + 2, bias_dtype, ctx.device) if bias_dtype else None
    a = a_full[rank * m_local:(rank + 1) * m_local].contiguous()
    ref = a_full.double() @ w.double().T + (bias.double() if bias is not None else 0)
    out = None
    if give_out:             # rows further apart than N: the GEMMs write into its rows
        out = torch.empty(m_local * world, n + rank + 3, dtype=torch.bfloat16,
                          device=ctx.device)[:, :n + rank]
    got = _schedule_call(ctx, "all_gather_matmul", a, w, bias, out)
    assert out is None or got.data_ptr() == out.data_ptr()
    assert_close(got, ref, f"all_gather_matmul M={m_local * world} N={n + rank} K={k}")


def _row_parallel(ctx, op, m, n, k_locals, bias_dtype, give_out, seed):
    world, rank = ctx.world_size, ctx.rank
    ks = [k_locals[r % len(k_locals)] for r in range(world)]
    lo, hi = sum(ks[:rank]), sum(ks[:rank + 1])
    a_full = make((m, sum(ks)), seed, torch.bfloat16, ctx.device)
    w_full = make((n, sum(ks)), seed + 1, torch.bfloat16, ctx.device)
    bias = make((n,), seed + 2, bias_dtype, ctx.device) if bias_dtype else None
    a, w = a_full[:, lo:hi].contiguous(), w_full[:, lo:hi].contiguous()
    ref = a_full.double() @ w_full.double().T + (bias.double() if bias is not None else 0)
    rows = m // world if op == "matmul_reduce_scatter" else m
    out = torch.empty(rows, n + 5, dtype=torch.bfloat16, device=ctx.device)[:, :n] \
        if give_out else None
    got = _schedule_call(ctx, op, a, w, bias, out)
    what = f"{op} M={m} N={n} K={ks}"
    if op == "matmul_reduce_scatter":
        assert_close(got, ref.chunk(world)[rank], what)
    else:
        assert_close(got, ref, what)
        everyone = [torch.empty_like(got) for _ in range(world)]
        torch.distributed.all_gather(everyone, got.contiguous(), group=ctx.group)
        assert all(torch.equal(everyone[0], o) for o in everyone), f"{what}: ranks differ"


def _every_case(ctx):
    """Every op at several shapes, in one pool run; the first shape of each op again last
    (its plan's second run: the epochs advance, the buffers are reused)."""
    world = ctx.world_size
    for call in range(2):
        s = 100 * call
        _all_gather(ctx, 1, 40, 64, None, False, 1 + s)              # M = world, one row each
        _row_parallel(ctx, "matmul_reduce_scatter", world, 40, (64,), None, False, 4 + s)
        _row_parallel(ctx, "matmul_all_reduce", 1, 40, (64,), torch.bfloat16, False, 7 + s)
        if call:
            break
        _all_gather(ctx, 5, 45, 72, torch.bfloat16, True, 2)         # odd N (per rank), out
        _all_gather(ctx, 3, 33, 40, torch.float32, False, 3)         # fp32 bias, odd K
        _row_parallel(ctx, "matmul_reduce_scatter", 3 * world, 45, (72, 8), torch.bfloat16,
                      True, 5)
        _row_parallel(ctx, "matmul_reduce_scatter", 5 * world, 24, (40, 0), torch.float32,
                      False, 6)                                       # an empty K shard
        _row_parallel(ctx, "matmul_all_reduce", 7, 45, (72, 8), None, True, 8)
        _row_parallel(ctx, "matmul_all_reduce", 2 * world + 1, 24, (40, 0), torch.float32,
                      False, 9)
    ctx.sync()


def test_pipelined_against_fp64_torch(pool):
    pool.run(_every_case)


def _replayed(ctx):
    """GPUs: each op captured once into a CUDA graph (copy stream, events and all) and
    replayed on new inputs copied into the captured tensors: right every replay."""
    world, rank = ctx.world_size, ctx.rank
    m, n, k = 8 * world, 136, 96
    for op in ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce"):
        a_full = make((m, k * (1 if op == "all_gather_matmul" else world)), 1, torch.bfloat16,
                      ctx.device)
        w_full = make((n, a_full.shape[1]), 2, torch.bfloat16, ctx.device)
        if op == "all_gather_matmul":
            a = a_full[rank * 8:(rank + 1) * 8].clone()
            w = w_full.clone()
        else:
            a = a_full[:, rank * k:(rank + 1) * k].clone()
            w = w_full[:, rank * k:(rank + 1) * k].clone()
        out = _schedule_call(ctx, op, a, w)              # eager: plans, workspaces
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _schedule_call(ctx, op, a, w, out=out)
        torch.cuda.current_stream().wait_stream(side)
        ctx.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _schedule_call(ctx, op, a, w, out=out)
        for seed in (3, 4):
            a_full = make(a_full.shape, seed, torch.bfloat16, ctx.device)
            a.copy_(a_full[rank * 8:(rank + 1) * 8] if op == "all_gather_matmul"
                    else a_full[:, rank * k:(rank + 1) * k])
            ctx.barrier()
            graph.replay()
            torch.cuda.synchronize()
            ref = a_full.double() @ w_full.double().T
            if op == "matmul_reduce_scatter":
                ref = ref.chunk(world)[rank]
            assert_close(out, ref, f"{op} replayed from a CUDA graph, seed {seed}")
        ctx.barrier()
        del graph


def test_pipelined_replayed_from_a_cuda_graph(pool):
    if pool.backend != "cuda":
        pytest.skip("CUDA graphs need GPUs (streams and events are no-ops on the CPU)")
    pool.run(_replayed)


MULTI = [w for w in WORLD_SIZES if w >= 2] or [2]


@pytest.fixture(params=MULTI, ids=lambda w: f"world{w}")
def multi_pool(request):
    from ..conftest import get_pool
    return get_pool(request.param)


def _sizes_differ(ctx):
    """Rank 0 gathers 3 rows, the others 4 (the same workspace): poison, then every rank
    raises at its next call; reset gives a working context."""
    k, n = 32, 24
    for m in (3, 4):                  # both plans built (and compiled) on every rank first
        _schedule_call(ctx, "all_gather_matmul",
                       torch.ones(m, k, dtype=torch.bfloat16, device=ctx.device),
                       torch.ones(n, k, dtype=torch.bfloat16, device=ctx.device))
    ctx.sync()
    timeout = ctx.timeout_s
    ctx.set_timeout(20.0)
    try:
        m = 3 if ctx.rank == 0 else 4
        a = torch.randn(m, k, device=ctx.device).to(torch.bfloat16)
        out = _schedule_call(ctx, "all_gather_matmul", a,
                             torch.ones(n, k, dtype=a.dtype, device=ctx.device))
        poisoned = bool(out.float().isnan().all())
        try:
            ctx.barrier()
            kind = None
        except Exception as exc:           # noqa: BLE001 -- the test inspects what came
            kind = type(exc).__name__
        ctx.reset()
        a = torch.ones(4, k, dtype=torch.bfloat16, device=ctx.device)
        again = _schedule_call(ctx, "all_gather_matmul", a,
                               torch.ones(n, k, dtype=a.dtype, device=ctx.device))
        right = bool((again.float() == k).all())
        return poisoned, kind, right
    finally:
        ctx.set_timeout(timeout)


def test_sizes_that_differ_are_poisoned_and_raised(multi_pool):
    for rank, (poisoned, kind, right) in enumerate(multi_pool.run(_sizes_differ)):
        assert poisoned, f"rank {rank}: the output of a mismatched call is not NaN"
        assert kind in (CallMismatch.__name__, PeerFailed.__name__), (rank, kind)
        assert right, f"rank {rank}: the call after reset() is wrong"
