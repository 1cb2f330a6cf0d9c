"""Fuzzing the fused GEMM + communication ops against plain torch: all_gather_matmul,
matmul_reduce_scatter and matmul_all_reduce with random small shapes (odd sizes, M = 1,
M not a multiple of a tile, a different N per rank for the column-parallel op, a
different K shard per rank for the row-parallel ones), bf16 and fp16, with or without a
bias (in the inputs' dtype or fp32), `out` given or not (plain, on the heap, strided),
strided inputs (a column shard of a wider matrix), every schedule (fused, sequential,
epilogue, plain, auto, and any other registered: trident/ops/schedules.py), and now and
then debug mode on.

Every rank draws the same case from its seed, builds every rank's inputs and checks its
own output against an fp32 reference on the gathered inputs, element by element, within
a bound scaled to the sum of the magnitudes of the terms (so cancellation in a sum of
bf16 partials is no false alarm, and one wrong element is still caught).
"""
import random

import pytest
import torch

from .common import POOL_WORLDS  # noqa: F401 (this module's pools: tests/conftest.py)
from .common import num_cases, run_cases, run_family, skip_unless_fuzzed_world

DTYPES = (torch.bfloat16, torch.float16)
SIZES = [1, 2, 3, 5, 7, 8, 13, 16, 17, 24, 31, 33, 40, 48]   # tiles are 16 x 32 x 32 here
EPS = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def _randn(g, shape, dtype):
    gen = torch.Generator().manual_seed(g.randrange(1 << 30))
    return torch.randn(shape, generator=gen).to(dtype)


def _bound_check(what, dtype, terms):
    """A check for run_cases: |got - ref| <= c * eps(dtype) * scale, element by element,
    where scale = |ref| + sum of |terms| (the magnitudes whose roundings make the error:
    the products summed and the bias); NaN (an element never written) fails."""
    def check(got, expected):
        ref, scale = expected
        assert got.shape == ref.shape, f"shape {list(got.shape)}, expected {list(ref.shape)}"
        err = (got.float() - ref).abs()
        bound = terms * EPS[dtype] * (scale + ref.abs()) + 1e-6
        bad = ~(err <= bound)                       # NaN counts as bad
        if bad.any():
            i = bad.nonzero()[0].tolist()
            raise AssertionError(
                f"{int(bad.sum())} of {ref.numel()} elements off; first at {i}: got "
                f"{got[tuple(i)].item()}, expected {ref[tuple(i)].item()} (bound "
                f"{bound[tuple(i)].item():.3g})")
    return check


def _place(ctx, g, shape, dtype, keep, numel_max, extra_cols=0):
    """A 2-D tensor of `shape` (filled by the caller): plain, on the heap, at a heap
    offset that differs by rank, or a column slice of a wider matrix (stride(0) > cols).
    Heap allocations are of numel_max elements (the largest over the ranks): every rank
    must allocate the same sizes."""
    where = g.choice(["plain", "plain", "heap", "shifted", "strided"])
    rows, cols = shape
    if where == "plain":
        return torch.empty(shape, dtype=dtype, device=ctx.device), where
    pad = g.randrange(1, 5) if where == "shifted" else 0
    if where in ("heap", "shifted"):
        big = ctx.empty(numel_max + pad * ctx.world_size, dtype=dtype)
        keep.append(big)
        return big[pad * ctx.rank:pad * ctx.rank + rows * cols].view(rows, cols), where
    wide = cols + extra_cols + g.randrange(1, 6)
    big = torch.empty(rows, wide, dtype=dtype, device=ctx.device)
    # g.random(), not randrange: the draws must not depend on this rank's sizes, or the
    # ranks' generators (and so their later calls) would part ways
    start = int(g.random() * (wide - cols + 1))
    return big[:, start:start + cols], f"strided({wide})"


def _out(ctx, g, shape, dtype, keep, numel_max):
    """None (the op allocates it) or a NaN-filled tensor placed like an input."""
    if g.random() < 0.4:
        return None, "none"
    out, where = _place(ctx, g, shape, dtype, keep, numel_max)
    out.fill_(float("nan"))
    return out, where


def _bias(g, n, dtype, tensor=None):
    """None, or a bias in the op's dtype or float32 (`tensor`: its values)."""
    kind = g.choice([None, "same", "fp32"])
    if kind is None:
        return None, "none"
    b = _randn(g, (n,), torch.float32) if tensor is None else tensor
    return b.to(dtype if kind == "same" else torch.float32), str(b.to(dtype if kind == "same" else torch.float32).dtype)


def _options(ctx, g, op):
    """(schedule, debug mode on for this call). The same draw on every rank: the
    registered schedules are the same everywhere, and so is whether NCCL can run (agreed
    at the context's creation); "plain" (cuBLAS + NCCL) only where it can (ranks that
    share a GPU have no NCCL: tests/ccl/test_no_nccl.py checks its error), "async_tp"
    (torch's) only on GPUs of their own and for the ops torch has
    (schedules.unavailable)."""
    from trident.ops import schedules
    names = ["fused", "auto"] + [n for n in schedules.registered(op) if n != "pipelined"]
    names += ["pipelined"] if "pipelined" in schedules.registered(op) else []
    names = [n for n in names if n == "auto" or schedules.unavailable(ctx, op, n) is None]
    return g.choice(names), g.random() < 0.1


def _call(ctx, debug, fn, *args, **kwargs):
    before = ctx.debug
    ctx.debug = debug
    try:
        return fn(*args, **kwargs)
    finally:
        ctx.debug = before


def _all_gather_matmul(ctx, seed):
    """out [M, N_r] = cat(a_0 .. a_w-1) @ w_r.T + bias_r; N differs by rank."""
    g = random.Random(f"all_gather_matmul-{seed}")
    world, r = ctx.world_size, ctx.rank
    dtype = g.choice(DTYPES)
    m_local, k = g.choice(SIZES[:10]), g.choice(SIZES)
    ns = [g.choice(SIZES) for _ in range(world)]
    algorithm, debug = _options(ctx, g, "all_gather_matmul")
    a_all = [_randn(g, (m_local, k), dtype) for _ in range(world)]
    w_all = [_randn(g, (n, k), dtype) for n in ns]
    biases = [_bias(g, n, dtype) for n in ns]
    keep = []
    a, a_where = _place(ctx, g, (m_local, k), dtype, keep, m_local * k)
    a.copy_(a_all[r])
    w, w_where = _place(ctx, g, (ns[r], k), dtype, keep, max(ns) * k)
    w.copy_(w_all[r])
    bias, bias_kind = biases[r]
    out, out_where = _out(ctx, g, (m_local * world, ns[r]), dtype, keep, m_local * world * max(ns))
    what = (f"all_gather_matmul seed {seed} {dtype} m_local={m_local} K={k} N per rank={ns} "
            f"bias={bias_kind} algorithm={algorithm} debug={debug} a={a_where} w={w_where} "
            f"out={out_where}")
    got = _call(ctx, debug, ctx.all_gather_matmul, a, w,
                bias=None if bias is None else bias.to(ctx.device), out=out,
                algorithm=algorithm)
    if out is not None:
        assert got is out, f"{what}: did not return the out it was given"
    a_full = torch.cat(a_all).float()
    ref = a_full @ w_all[r].float().T
    scale = a_full.abs() @ w_all[r].float().abs().T
    if bias is not None:
        ref, scale = ref + bias.float(), scale + bias.float().abs()
    return [(got, (ref, scale), what, _bound_check(what, dtype, 4))]


def _row_parallel(ctx, seed, op):
    """matmul_reduce_scatter / matmul_all_reduce: rank s holds a_s [M, K_s], w_s [N, K_s]
    (K_s differs by rank); out = (sum_s a_s @ w_s.T + bias), rows chunked for
    reduce_scatter. The bias is the same on every rank (added once)."""
    g = random.Random(f"{op}-{seed}")
    world, r = ctx.world_size, ctx.rank
    dtype = g.choice(DTYPES)
    if op == "matmul_reduce_scatter":
        m = world * g.choice(SIZES[:10])
    else:
        m = g.choice(SIZES)
    n = g.choice(SIZES)
    ks = [g.choice(SIZES) for _ in range(world)]
    algorithm, debug = _options(ctx, g, op)
    a_all = [_randn(g, (m, k), dtype) for k in ks]
    w_all = [_randn(g, (n, k), dtype) for k in ks]
    bias, bias_kind = _bias(g, n, dtype)
    keep = []
    a, a_where = _place(ctx, g, (m, ks[r]), dtype, keep, m * max(ks), sum(ks) - ks[r])
    a.copy_(a_all[r])
    w, w_where = _place(ctx, g, (n, ks[r]), dtype, keep, n * max(ks), sum(ks) - ks[r])
    w.copy_(w_all[r])
    rows = m // world if op == "matmul_reduce_scatter" else m
    out, out_where = _out(ctx, g, (rows, n), dtype, keep, rows * n)
    what = (f"{op} seed {seed} {dtype} M={m} N={n} K per rank={ks} bias={bias_kind} "
            f"algorithm={algorithm} debug={debug} a={a_where} w={w_where} out={out_where}")
    fn = getattr(ctx, op)
    got = _call(ctx, debug, fn, a, w, bias=None if bias is None else bias.to(ctx.device),
                out=out, algorithm=algorithm)
    if out is not None:
        assert got is out, f"{what}: did not return the out it was given"
    ref = sum(x.float() @ y.float().T for x, y in zip(a_all, w_all))
    scale = sum(x.float().abs() @ y.float().abs().T for x, y in zip(a_all, w_all))
    if bias is not None:
        ref, scale = ref + bias.float(), scale + bias.float().abs()
    if op == "matmul_reduce_scatter":
        ref, scale = ref.chunk(world)[r], scale.chunk(world)[r]
    # partials are rounded to the dtype before the sum (fused), or summed in it (gloo)
    return [(got, (ref, scale), what, _bound_check(what, dtype, 2 * (world + 1)))]


OPS = {
    "all_gather_matmul": _all_gather_matmul,
    "matmul_reduce_scatter": lambda ctx, seed: _row_parallel(ctx, seed, "matmul_reduce_scatter"),
    "matmul_all_reduce": lambda ctx, seed: _row_parallel(ctx, seed, "matmul_all_reduce"),
}


def _mixed(ctx, seed):
    """The three ops interleaved back to back (their workspaces and epochs side by side)."""
    op = sorted(OPS)[random.Random(f"mixed-{seed}").randrange(len(OPS))]
    return OPS[op](ctx, 1_000_000 + seed)


def _batch(ctx, seeds, op):
    return run_cases(ctx, _mixed if op == "mixed" else OPS[op], seeds)


@pytest.mark.parametrize("op", list(OPS) + ["mixed"])
def test_fuzz_fused_op(pool, request, op):
    """150 cases per op and fuzzed world size in CI (300 per op over world sizes 2 and 3,
    common.WORLD_SIZES), 50 of the ops mixed; --cases N for more. One pool.run per world
    size."""
    skip_unless_fuzzed_world(pool)
    n = num_cases(request, 50 if op == "mixed" else 150)
    run_family(pool, _batch, n, op, batch=min(n, 150))   # CI: one pool.run
