"""all_to_all, every algorithm: even and uneven splits, ranks that send or receive no
rows at all, odd row sizes (3 bf16, 5 bools), plain outputs, heap outputs at a different
offset on every rank and zero-row heap views, back to back without a sync; against the
rows each peer sent (plain torch on every rank's input). Also: aliasing and bad splits
are rejected, one_shot's slot limit is an error, never a silent truncation."""
import os
import subprocess
import sys

import pytest
import torch

from trident.ccl.all_to_all.one_shot import CPU_SLOT_BYTES

from .refs import assert_equal, rank_inputs

ALGORITHMS = ("push", "one_shot")


def _split_matrix(kind, w):
    """splits[s][d] = rows rank s sends to rank d."""
    if kind == "even":
        return [[2] * w for _ in range(w)]
    if kind == "uneven":                       # some zeros
        return [[(s * 3 + d * 5 + 1) % 4 for d in range(w)] for s in range(w)]
    # "sparse": rank 0 receives nothing, the last rank sends nothing
    return [[0 if d == 0 or s == w - 1 else (s + d) % 3 + 1 for d in range(w)]
            for s in range(w)]


# block=16 below: several blocks per peer, so both CPU programs move rows.
# (splits, dtype, row shape, where out lives): "plain" torch tensor; "heap" a view of a
# heap buffer at a whole-row offset that differs by rank (zero-row views included);
# "odd" the same at an offset of a single element (not 16-byte aligned)
CASES = [("even", torch.float32, (3,), "plain"), ("uneven", torch.bfloat16, (3,), "heap"),
         ("sparse", torch.bool, (5,), "plain"), ("sparse", torch.int8, (3,), "heap"),
         ("uneven", torch.float16, (), "plain"), ("sparse", torch.bfloat16, (4,), "heap"),
         ("uneven", torch.float32, (8,), "odd")]


def _all_to_all_cases(ctx, algorithms):
    w, r = ctx.world_size, ctx.rank
    checks, buffers = [], []
    for algorithm in algorithms:
        for i, (kind, dtype, row, where) in enumerate(CASES):     # back to back, no sync
            splits = _split_matrix(kind, w)
            xs = rank_inputs(w, (16 * w, *row), dtype, seed=i)
            xs = [x[:sum(splits[s])] for s, x in enumerate(xs)]
            in_splits, out_splits = splits[r], [splits[s][r] for s in range(w)]
            n = sum(out_splits)
            init = torch.full((n, *row), 7, device=ctx.device).to(dtype)
            if where == "plain":
                out = init
            else:                     # same allocation everywhere, a rank-dependent view
                big = ctx.empty(16 * w + w, *row, dtype=dtype)
                buffers.append(big)
                out = big[r:r + n] if where == "heap" else \
                    big.view(-1)[r + 1:r + 1 + init.numel()].view(init.shape)
                out.copy_(init)
            kw = {} if kind == "even" else {"out_splits": out_splits, "in_splits": in_splits}
            ctx.all_to_all(out, xs[r].to(ctx.device), algorithm=algorithm, block=16, **kw)
            expected = torch.cat([xs[s].split(splits[s])[r] for s in range(w)])
            checks.append((out, expected, f"{algorithm} {kind} {dtype} {row} {where}"))
    ctx.sync()
    for out, expected, what in checks:
        assert_equal(out, expected, what)
    for big in buffers:
        ctx.free(big)


def test_all_to_all(pool):
    pool.run(_all_to_all_cases, ALGORITHMS)


def _zero_row_output(ctx):
    """Issue 11: rank 0 sends 3 rows to rank 1 and receives none (was a segfault, or with
    heap views a HeapMismatchError); the other ranks take part with nothing."""
    w, me = ctx.world_size, ctx.rank
    S = [[0] * w for _ in range(w)]
    S[0][1] = 3
    ins, outs = S[me], [S[s][me] for s in range(w)]
    xs = rank_inputs(w, (3, 8), torch.float32, seed=7)
    for algorithm in ALGORITHMS:
        for heap in (False, True):
            big = ctx.empty(3, 8) if heap else None
            out = big[:sum(outs)] if heap else torch.empty(sum(outs), 8, device=ctx.device)
            ctx.all_to_all(out, xs[me][:sum(ins)].to(ctx.device), out_splits=outs,
                           in_splits=ins, algorithm=algorithm)
            ctx.sync()
            assert_equal(out, xs[0][:sum(outs)], f"{algorithm} heap={heap}")
            if heap:
                ctx.free(big)


def test_all_to_all_zero_row_output(pool):
    pool.run(_zero_row_output)


def _aliasing(ctx):
    w = ctx.world_size
    for algorithm in ALGORITHMS:
        x = torch.ones(2 * w, 3, device=ctx.device)
        with pytest.raises(ValueError, match="overlap"):
            ctx.all_to_all(x, x, algorithm=algorithm)
        h = ctx.zeros(4 * w, 3)
        with pytest.raises(ValueError, match="overlap"):
            ctx.all_to_all(h[w:3 * w], h[:2 * w], algorithm=algorithm)
        ctx.free(h)


def _one_shot_too_large(ctx):
    """A message beyond one_shot's slot raises on its sender and receiver; the other
    ranks' rows still arrive."""
    w, r = ctx.world_size, ctx.rank
    rows = CPU_SLOT_BYTES * 3 // 2 // 1024     # 1 KiB rows from rank 0 to rank 1
    S = [[1] * w for _ in range(w)]
    S[0][1] = rows
    xs = rank_inputs(w, (rows + w, 1024), torch.int8, seed=11)
    xs = [x[:sum(S[s])] for s, x in enumerate(xs)]
    out = torch.zeros(sum(S[s][r] for s in range(w)), 1024, dtype=torch.int8, device=ctx.device)
    call = (lambda: ctx.all_to_all(out, xs[r].to(ctx.device), out_splits=[S[s][r] for s in range(w)],
                                   in_splits=S[r], algorithm="one_shot"))
    if r in (0, 1):
        with pytest.raises(ValueError, match="exceeds its scratch slot"):
            call()
    else:
        call()
    ctx.sync()
    if r > 1:
        assert_equal(out, torch.cat([xs[s].split(S[s])[r] for s in range(w)]), "others")


def test_all_to_all_aliasing_and_limits(pool):
    pool.run(_aliasing)
    if pool.backend == "cpu":              # the GPU slot is 1 MiB: too slow to fill here
        pool.run(_one_shot_too_large)


def _bad_inputs(ctx, algorithm):
    w = ctx.world_size
    with pytest.raises(ValueError, match="not a multiple of world size"):
        ctx.all_to_all(torch.empty(w + 1, device=ctx.device), torch.ones(w + 1, device=ctx.device))
    with pytest.raises(ValueError, match="in_splits must be"):
        ctx.all_to_all(torch.empty(w, device=ctx.device), torch.ones(w, device=ctx.device), out_splits=[1] * w, in_splits=[2] * w)
    with pytest.raises(ValueError, match="same shape after dim 0"):
        ctx.all_to_all(torch.empty(w, 2, device=ctx.device), torch.ones(w, 3, device=ctx.device))
    # rank 0 sends its peers a row more than they expect: caught in debug mode
    in_splits = [2] * w
    if ctx.rank == 0:
        in_splits[0], in_splits[1] = 1, 3
    ctx.debug = True
    try:
        with pytest.raises(ValueError, match="differs from rank p's out_splits"):
            ctx.all_to_all(torch.empty(2 * w, device=ctx.device), torch.ones(2 * w, device=ctx.device), out_splits=[2] * w,
                           in_splits=in_splits, algorithm=algorithm)
    finally:
        ctx.debug = False


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_all_to_all_bad_inputs(pool, algorithm):
    pool.run(_bad_inputs, algorithm)


def compile_sm90(compile_ptx) -> None:
    """Both kernels compile for sm_90, and their copies keep 16-byte accesses (push's copy
    into an output that is not 16-byte aligned may not). Run by the test below in a
    process of its own, after tests.language.compile_sm90 has switched the interpreter off."""
    import re
    from trident.ccl.all_to_all import one_shot as _  # noqa: F401
    kernels = {n: sys.modules[f"trident.ccl.all_to_all.{n}"] for n in ALGORITHMS}
    shared = dict(check="*i64", flags="*i64", sync="*i64", ctrl="*i64", heap_bases="*i64",
                  trace_buf="*i64", rank="i32", world_size="i32")
    signatures = {
        "push": (kernels["push"]._push_kernel,
                 dict(anchor="*i32", inp="*i32", splits="*i64", meta="*i64", **shared), 2),
        "one_shot": (kernels["one_shot"]._one_shot_kernel,
                     dict(out="*i32", inp="*i32", splits="*i64", slots="*i32", counts="*i64",
                          **shared, half="i32", counts_half="i32", stride="i32"), 3)}
    for name, (kernel, sig, aligned_copies) in signatures.items():
        sig.update(BLOCK="constexpr", ALIGN="constexpr", TRACE="constexpr")
        aligned = [a for a in sig if sig[a].startswith("*") or a in ("half", "counts_half",
                                                                       "stride")]
        ptx = compile_ptx(kernel, sig, {"BLOCK": 4096, "ALIGN": 16, "TRACE": False},
                          aligned=aligned, num_warps=8)
        stores = len(re.findall(r"st\.global\.v4\.b32", ptx))
        assert stores == 4 * aligned_copies and "ld.global.b32" not in ptx, \
            f"{name}: a copy lost its 16-byte accesses ({stores} vector stores)"
    print("ok")


def test_kernels_compile_for_sm90(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRIDENT_BACKEND")}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=root + os.pathsep + env.get("PYTHONPATH", ""))
    code = ("import tests.language.compile_sm90 as c, tests.ccl.test_all_to_all as t; "
            "t.compile_sm90(c.compile_ptx)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]
