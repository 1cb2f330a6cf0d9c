"""ctx.matmul_all_reduce_add_rmsnorm (trident/ops/matmul_all_reduce_add_rmsnorm.py, its one
kernel: epilogue_lamport.py, NORM) against an independent fp32 torch reference on the gathered
inputs: residual + (a_full @ w_full.T) + bias, rounded, then the norm -- at M = 1, 3, 17
(one and two row blocks of the CPU tile, programs with several tiles), N not a multiple of
the tile, K that differs by rank, bf16 and fp16, bias (bf16, fp32) or none, out given or
not, each schedule, every case called twice with Lamport rounds of other ops in between;
residual and out bitwise the same on every rank. A call whose M differs between ranks is
poisoned and raised on every rank (CallMismatch naming the op); bad inputs raise; auto
falls back to "sequential" past the kernel's limits; the race detector finds the row
blocks' hand-over ordered (it does not with a relaxed counter); a CUDA graph replays it
(GPUs)."""
import importlib
import time

import pytest
import torch


# the module (trident.ops exports the function under the same name)
op = importlib.import_module("trident.ops.matmul_all_reduce_add_rmsnorm")

from ..ccl.refs import captured
from ..faults.mismatch import MEET, assert_found_when_ranks_meet
from .reference import assert_close, make

NAME = "matmul_all_reduce_add_rmsnorm"
EPS = 1e-6
# (M, N, K of rank 0 -- rank r has K + 8 r --, dtype, bias dtype or None, out given,
# a a column view of the full matrix (strided rows), schedule, options)
CASES = [
    (1, 40, 24, torch.bfloat16, None, False, True, "fused", {}),
    (3, 33, 40, torch.float16, torch.float32, True, False, "fused", {}),
    (17, 72, 16, torch.bfloat16, torch.bfloat16, False, True, "auto", {}),
    (5, 48, 32, torch.bfloat16, torch.bfloat16, True, False, "sequential", {}),
    (3, 33, 8, torch.float16, None, False, True, "sequential",
     {"matmul_schedule": "epilogue"}),
]


def _inputs(ctx, M, N, K, dtype, bias_dtype, view, seed):
    """This rank's a, w, and the full matrices; residual, norm weight and bias the same on
    every rank."""
    ks = [K + 8 * r for r in range(ctx.world_size)]
    lo = sum(ks[:ctx.rank])
    a_full = make((M, sum(ks)), seed, dtype, "cpu")
    w_full = make((N, sum(ks)), seed + 1, dtype, "cpu")
    a = a_full.to(ctx.device)[:, lo:lo + ks[ctx.rank]]
    if not view:
        a = a.contiguous()
    w = w_full[:, lo:lo + ks[ctx.rank]].contiguous().to(ctx.device)
    residual = make((M, N), seed + 2, dtype, "cpu")
    # an fp32 norm weight beside an fp32 bias (the case that has one), else a's dtype
    norm_weight = (1 + 0.5 * make((N,), seed + 3, torch.float32, "cpu")).to(
        torch.float32 if bias_dtype == torch.float32 else dtype)
    bias = None if bias_dtype is None else make((N,), seed + 4, bias_dtype, "cpu")
    return a, w, a_full, w_full, residual, norm_weight, bias


def reference(a_full, w_full, bias, residual, norm_weight, eps=EPS):
    """(new residual, out) in plain fp32 torch, rounded as the op: residual once, out once."""
    s = a_full.float() @ w_full.float().T
    if bias is not None:
        s = s + bias.float()
    r = (residual.float() + s).to(residual.dtype)
    rf = r.float()
    out = rf / torch.sqrt((rf * rf).mean(-1, keepdim=True) + eps) * norm_weight.float()
    return r, out.to(residual.dtype)


def _values(ctx):
    results = []
    for i, (M, N, K, dtype, bias_dtype, out_given, view, schedule, opts) in enumerate(CASES):
        what = f"M={M} N={N} K={K} {dtype} bias={bias_dtype} out={out_given} {schedule}"
        a, w, a_full, w_full, residual, nw, bias = _inputs(ctx, M, N, K, dtype, bias_dtype,
                                                           view, 100 * i)
        res = residual.clone().to(ctx.device)
        dev_bias = None if bias is None else bias.to(ctx.device)
        expected_res, outs = residual, []
        in_place = i % 2 == 0           # residual_out=residual, or a new res (the default)
        for call in range(2):           # the second call: a warm plan, the next round
            out = torch.full((M, N), float("nan"), dtype=dtype, device=ctx.device) \
                if out_given else None
            before = res.clone()
            got, new_res = ctx.matmul_all_reduce_add_rmsnorm(
                a, w, res, nw.to(ctx.device), EPS, bias=dev_bias, out=out, schedule=schedule,
                **({"residual_out": res} if in_place else {}), **opts)
            assert out is None or got is out
            if in_place:
                assert new_res is res
            else:                       # residual untouched; the next call adds to res
                assert new_res is not res and torch.equal(res, before), what
                res = new_res
            outs.append(got.cpu().clone())
            # Lamport rounds of other ops in between: one round counter for all of them
            t = make((7,), i, torch.float32, ctx.device)
            ctx.all_reduce(t, algorithm="lamport")
            ctx.matmul_all_reduce(a, w, schedule="epilogue", exchange="lamport")
            ctx.sync()
            expected_res, ref = reference(a_full, w_full, bias, expected_res, nw)
            assert_close(got, ref, f"{what} out, call {call}")
            assert_close(res, expected_res.float(), f"{what} residual, call {call}")
        results.append((res.cpu().clone(), *outs))
    return results


def test_values_against_torch(pool):
    per_rank = pool.run(_values)
    for rank, mine in enumerate(per_rank[1:], 1):      # bitwise the same on every rank
        for i, (got, ref) in enumerate(zip(mine, per_rank[0])):
            for x, y in zip(got, ref):
                assert torch.equal(x, y), f"case {CASES[i][:5]}: rank {rank} differs from 0"


def _m_differs(ctx):
    """Rank 0 calls with M = 8, the others with 12 (one row block each on the CPU tile:
    the same grid); poisoned, raised on every rank, and right after ctx.reset()."""
    def call(M, seed=0, schedule="fused"):
        a, w, _, _, residual, nw, _ = _inputs(ctx, M, 40, 16, torch.bfloat16, None, False,
                                              seed)
        res = residual.clone().to(ctx.device)
        return ctx.matmul_all_reduce_add_rmsnorm(a, w, res, nw.to(ctx.device),
                                                 schedule=schedule)[::-1]

    for M in (8, 12):               # both sizes' kernels compiled on every rank first
        call(M)
    ctx.sync()
    timeout = ctx.timeout_s
    ctx.set_timeout(MEET)
    try:
        t0 = time.perf_counter()
        res, out = call(8 if ctx.rank == 0 else 12, seed=1)
        poisoned = bool(out.isnan().all()) and bool(res.isnan().all())     # waits
        call_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        try:
            call(12)                  # raises the pending error, before it launches
            kind, text = "no error", ""
        except Exception as exc:      # noqa: BLE001 -- the test inspects what came
            kind, text = type(exc).__name__, str(exc)
        took = time.perf_counter() - t0
        ctx.reset()
        a, w, a_full, w_full, residual, nw, _ = _inputs(ctx, 12, 40, 16, torch.bfloat16, None,
                                                        False, 5)
        out, res = ctx.matmul_all_reduce_add_rmsnorm(a, w, residual.to(ctx.device),
                                                     nw.to(ctx.device))
        ctx.sync()
        r, ref = reference(a_full, w_full, None, residual, nw)
        assert_close(out, ref, "after reset")
        assert_close(res, r.float(), "after reset: residual")
        return poisoned, kind, text, took, call_s
    finally:
        ctx.set_timeout(timeout)


def test_m_that_differs_is_poisoned_and_raised(pool):
    if pool.world_size == 1:
        pytest.skip("one rank cannot call differently from itself")
    assert_found_when_ranks_meet(pool.run(_m_differs), NAME)


def _race_free(ctx, seed):
    """Under the race detector (trident/sanitize/): the row blocks' residual tiles, stored
    by several programs and read by the last to arrive, are ordered by the counter."""
    from trident import sanitize
    a, w, a_full, w_full, residual, nw, bias = _inputs(ctx, 17, 72, 16, torch.float16,
                                                       torch.float16, False, 3)
    res = residual.clone()
    with sanitize.sanitizing(ctx, seed):
        for _ in range(2):              # back to back: counters rearmed, the next round
            out, _ = ctx.matmul_all_reduce_add_rmsnorm(a, w, res, nw, bias=bias,
                                                       residual_out=res, schedule="fused")
        ctx.barrier()
    r1, _ = reference(a_full, w_full, bias, residual, nw)
    r2, ref = reference(a_full, w_full, bias, r1, nw)
    assert_close(out, ref, "under the race detector")
    assert_close(res, r2.float(), "under the race detector: residual")
    return True


def test_race_detector_finds_no_race(pool):
    if pool.backend != "cpu" or pool.world_size > 3:
        pytest.skip("the race detector runs on the CPU emulation; 2 and 3 ranks suffice")
    assert all(pool.run(_race_free, 13))


def _debug_mode(ctx):
    ctx.debug = True
    try:
        a, w, a_full, w_full, residual, nw, bias = _inputs(ctx, 2, 24, 16, torch.bfloat16,
                                                           torch.bfloat16, False, 7)
        out, _ = ctx.matmul_all_reduce_add_rmsnorm(a, w, residual.to(ctx.device),
                                                   nw.to(ctx.device), bias=bias.to(ctx.device))
        assert_close(out, reference(a_full, w_full, bias, residual, nw)[1], "debug mode")
        if ctx.world_size > 1:
            m = 2 + ctx.rank
            with pytest.raises(ValueError, match="every rank must pass the same sizes"):
                ctx.matmul_all_reduce_add_rmsnorm(a[:1].expand(m, -1).contiguous(), w,
                                                  residual[:1].expand(m, -1).contiguous()
                                                  .to(ctx.device), nw.to(ctx.device))
    finally:
        ctx.debug = False


def test_debug_mode(pool):
    pool.run(_debug_mode)


def _bad_inputs(ctx):
    dev, bf = ctx.device, torch.bfloat16
    a = torch.randn(4, 16, dtype=bf, device=dev)
    w = torch.randn(8, 16, dtype=bf, device=dev)
    res = torch.randn(4, 8, dtype=bf, device=dev)
    nw = torch.ones(8, dtype=bf, device=dev)
    f = ctx.matmul_all_reduce_add_rmsnorm
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        f(a.float(), w.float(), res.float(), nw)
    with pytest.raises(ValueError, match=r"residual must have shape \[4, 8\]"):
        f(a, w, res[:, :4], nw)
    with pytest.raises(TypeError, match="residual must be torch.bfloat16"):
        f(a, w, res.half(), nw)
    with pytest.raises(ValueError, match=r"norm_weight must have shape \[8\]"):
        f(a, w, res, nw[:4])
    with pytest.raises(TypeError, match="norm_weight must be"):
        f(a, w, res, nw.int())
    with pytest.raises(ValueError, match="residual must be contiguous"):
        f(a, w, torch.randn(8, 4, dtype=bf, device=dev).t(), nw)
    with pytest.raises(ValueError, match="out must not be residual"):
        f(a, w, res, nw, out=res)
    with pytest.raises(ValueError, match=r"residual_out must have shape \[4, 8\]"):
        f(a, w, res, nw, residual_out=res[:2])
    buf = torch.randn(40, dtype=bf, device=dev)      # residual and a shifted view of it
    with pytest.raises(ValueError, match="residual_out must be residual itself"):
        f(a, w, buf[:32].view(4, 8), nw, residual_out=buf[3:35].view(4, 8))
    with pytest.raises(ValueError, match=r"bias must have shape \[8\]"):
        f(a, w, res, nw, bias=nw[:3])
    with pytest.raises(ValueError, match="their K differ"):
        f(a, w[:, :8], res, nw)
    with pytest.raises(ValueError, match="eps must be a non-negative number"):
        f(a, w, res, nw, -1.0)
    with pytest.raises(ValueError, match="unknown schedule 'plain'"):
        f(a, w, res, nw, schedule="plain")
    with pytest.raises(TypeError, match="takes the options"):
        f(a, w, res, nw, schedule="fused", matmul_schedule="plain")
    # past the one kernel's limits: "fused" says the limit and what to use; auto falls back
    big = torch.randn(op.MAX_M + 1, 16, dtype=bf, device=dev)
    big_res = torch.randn(big.shape[0], 8, dtype=bf, device=dev)
    with pytest.raises(ValueError, match=r"at most 256 rows .*schedule='sequential'"):
        f(big, w, big_res, nw, schedule="fused")
    cap = op.lamport.slot_bytes(ctx)
    wide = torch.randn(cap // (2 * 4) + 8, 1, dtype=bf, device=dev)
    with pytest.raises(ValueError, match=f"at most {cap} bytes of M x N partial sums"):
        f(a[:, :1], wide, torch.randn(4, wide.shape[0], dtype=bf, device=dev),
          torch.ones(wide.shape[0], dtype=bf, device=dev), schedule="fused")
    assert op.resolve(ctx, "auto", 4, wide.shape[0], 2) == "sequential"
    assert op.resolve(ctx, "auto", 4, 8, 2) == "fused"
    # auto past the row limit: the sequential path, right
    g = torch.Generator().manual_seed(11)
    parts = [torch.randn(big.shape[0], 16, generator=g).to(bf) for _ in range(ctx.world_size)]
    w_parts = [torch.randn(8, 16, generator=g).to(bf) for _ in range(ctx.world_size)]
    res0 = big_res.cpu().clone()
    out, new_res = f(parts[ctx.rank].to(dev), w_parts[ctx.rank].to(dev), big_res, nw)
    r, ref = reference(torch.cat(parts, 1), torch.cat(w_parts, 1), None, res0, nw.cpu())
    ctx.sync()
    assert_close(out, ref, "auto past the row limit")
    assert_close(new_res, r.float(), "auto past the row limit: res")
    assert torch.equal(big_res.cpu(), res0), "the sequential path left residual as it was"


def test_bad_inputs_and_limits(pool):
    pool.run(_bad_inputs)


def _graph(ctx, replays=10):
    """Captured once (after an eager warm-up), replayed with new a and residual each time:
    the rounds and counters live on the device."""
    M, N, K, dtype = 5, 4096 + 64, 512, torch.bfloat16
    a, w, _, w_full, residual, nw, b_cpu = _inputs(ctx, M, N, K, dtype, dtype, False, 1)
    res, out = residual.clone().to(ctx.device), torch.empty(M, N, dtype=dtype, device=ctx.device)
    nw, bias = nw.to(ctx.device), b_cpu.to(ctx.device)
    ops = lambda: ctx.matmul_all_reduce_add_rmsnorm(a, w, res, nw, bias=bias,   # noqa: E731
                                                    out=out, residual_out=res,
                                                    schedule="fused")
    graph = captured(ctx, ops)
    for i in range(replays):
        a_i, _, a_full, _, residual, _, _ = _inputs(ctx, M, N, K, dtype, dtype, False, 10 + i)
        a.copy_(a_i)                  # new rows of a and a new residual; w, bias as captured
        res.copy_(residual)
        graph.replay()
        ctx.sync()
        r, ref = reference(a_full, w_full, b_cpu, residual, nw.cpu())
        assert_close(out, ref, f"replay {i}")
        assert_close(res, r.float(), f"replay {i}: residual")
        ctx.barrier()


def test_graph_capture_and_replay(pool):
    if pool.backend != "cuda":
        pytest.skip("CUDA graphs need GPUs")
    pool.run(_graph)
