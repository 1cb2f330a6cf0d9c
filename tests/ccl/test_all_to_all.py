"""all_to_all, every algorithm of the registry (tests/algorithms.py): even and uneven
splits, ranks that send or receive no rows at all, odd row sizes (3 bf16, 5 bools), plain
outputs, heap outputs at a different offset on every rank and zero-row heap views, back
to back without a sync; against the
rows each peer sent (plain torch on every rank's input). Also: aliasing and bad splits
are rejected (a count that differs between two ranks is CallMismatch, its rows NaN),
one_shot's slot limit and lamport's capacity are errors, never a silent truncation;
lamport's rounds, interleaved with the other Lamport kernels, bit for bit."""
import os
import subprocess
import sys
import time

import pytest
import torch

from trident.ccl import lamport
from trident.ccl.all_to_all.one_shot import CPU_SLOT_BYTES
from trident.runtime.errors import CallMismatch, PeerFailed

from .. import algorithms
from .refs import assert_equal, rank_inputs

ALGORITHMS = tuple(algorithms.kernels("all_to_all"))     # the registry's (tests/algorithms.py)


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


def _all_to_all_cases(ctx, algorithms, cases=CASES, scale=1, programs=None):
    """`scale` multiplies every split (rows over several blocks); `programs` caps the
    launch size (the pairs' programs: all_to_all/rows.py)."""
    w, r = ctx.world_size, ctx.rank
    checks, buffers = [], []
    for algorithm in algorithms:
        for i, (kind, dtype, row, where) in enumerate(cases):     # back to back, no sync
            splits = [[scale * c for c in line] for line in _split_matrix(kind, w)]
            xs = rank_inputs(w, (16 * w * scale, *row), dtype, seed=i)
            xs = [x[:sum(splits[s])] for s, x in enumerate(xs)]
            in_splits, out_splits = splits[r], [splits[s][r] for s in range(w)]
            n = sum(out_splits)
            init = torch.full((n, *row), 7, device=ctx.device).to(dtype)
            if where == "plain":
                out = init
            else:                     # same allocation everywhere, a rank-dependent view
                big = ctx.empty(16 * w * scale + w, *row, dtype=dtype)
                buffers.append(big)
                out = big[r:r + n] if where == "heap" else \
                    big.view(-1)[r + 1:r + 1 + init.numel()].view(init.shape)
                out.copy_(init)
            kw = {} if kind == "even" else {"out_splits": out_splits, "in_splits": in_splits}
            ctx.all_to_all(out, xs[r].to(ctx.device), algorithm=algorithm, block=16,
                           programs=programs, **kw)
            expected = torch.cat([xs[s].split(splits[s])[r] for s in range(w)])
            checks.append((out, expected, f"{algorithm} {kind} {dtype} {row} {where}"))
    ctx.sync()
    for out, expected, what in checks:
        assert_equal(out, expected, what)
    for big in buffers:
        ctx.free(big)


def test_all_to_all(pool):
    pool.run(_all_to_all_cases, ALGORITHMS)


def test_all_to_all_many_programs(pool):
    """Rows over up to 7 blocks per peer and 7 programs: one_shot's pairs get several
    programs each (the ones after the first wait for the count that the first carries),
    push's pair sections overlap and wrap around the grid."""
    pool.run(_all_to_all_cases, ALGORITHMS, CASES[:2] + CASES[5:], 8, 7)


def _lamport_rounds(ctx):
    """lamport's rounds (ccl/lamport.py, "Rounds": the counter is the context's, shared by
    every Lamport kernel): a dozen all_to_alls back to back, splits (uneven, zero rows,
    even), dtypes, row widths and launch sizes changing every call, interleaved with
    broadcast's and all_reduce's lamport and, once, a flag-protocol all_to_all; every
    output equal bit for bit to the rows its peers sent. Then rows of the bit patterns a
    Lamport sentinel reserves (-0.0, 0x80008000, NaNs) travel unchanged."""
    w, r = ctx.world_size, ctx.rank
    shapes = [(torch.bfloat16, (3,), "uneven", 16, None), (torch.int64, (2,), "sparse", 4, 3),
              (torch.int8, (5,), "even", None, None), (torch.float32, (), "uneven", 64, 7),
              (torch.bool, (7,), "sparse", 16, 2), (torch.float16, (4,), "uneven", None, 1)]
    calls = []
    for i in range(12):
        dtype, row, kind, block, programs = shapes[i % len(shapes)]
        splits = [[(c + i) % 4 if kind != "even" else c for c in line]
                  for line in _split_matrix(kind, w)]
        if kind == "sparse":                     # keep its zeros: rank 0 receives nothing,
            splits = [[0 if d == 0 or s == w - 1 else c for d, c in enumerate(line)]
                      for s, line in enumerate(splits)]              # the last sends nothing
        xs = rank_inputs(w, (4 * w, *row), dtype, seed=40 + i)
        xs = [x[:sum(splits[s])] for s, x in enumerate(xs)]
        out = torch.empty(sum(splits[s][r] for s in range(w)), *row, dtype=dtype,
                          device=ctx.device)
        kw = {} if kind == "even" else {"out_splits": [splits[s][r] for s in range(w)],
                                        "in_splits": splits[r]}
        ctx.all_to_all(out, xs[r].to(ctx.device), algorithm="lamport", block=block,
                       programs=programs, **kw)
        calls.append((out, torch.cat([xs[s].split(splits[s])[r] for s in range(w)]), i))
        if i % 3 == 1:
            t = rank_inputs(w, (17,), torch.int16, seed=60 + i)
            b = t[r].clone().to(ctx.device)
            ctx.broadcast(b, src=i % w, algorithm="lamport", block=block)
            calls.append((b, t[i % w], f"broadcast after {i}"))
            a = torch.full((9,), float(r + 1), device=ctx.device)
            ctx.all_reduce(a, algorithm="lamport")
            calls.append((a, torch.full((9,), w * (w + 1) / 2), f"all_reduce after {i}"))
        if i == 5:
            a2a = torch.empty(2 * w, 3, device=ctx.device)
            ctx.all_to_all(a2a, torch.full((2 * w, 3), float(r), device=ctx.device),
                           algorithm="one_shot")
            calls.append((a2a, torch.arange(w).float().repeat_interleave(2)[:, None]
                          .expand(2 * w, 3), "one_shot in between"))
    ctx.sync()
    for out, want, i in calls:
        assert torch.equal(out.cpu().view(torch.uint8), want.contiguous().view(torch.uint8)), \
            f"lamport round {i}: {out} != {want}"
    odd = torch.tensor([0x80008000, 0x80000000, 0x00008000, 0x7FC00001, 0xFFFFFFFF, 0x8000],
                       dtype=torch.int64).to(torch.int32)
    for dtype in (torch.float32, torch.bfloat16):
        rows = [(odd + s).view(dtype).repeat(w).view(w, -1) for s in range(w)]   # a row a peer
        out = torch.empty_like(rows[r]).to(ctx.device)
        ctx.all_to_all(out, rows[r].clone().to(ctx.device), algorithm="lamport")
        want = torch.cat([rows[s][r:r + 1] for s in range(w)])
        assert torch.equal(out.cpu().view(torch.uint8), want.view(torch.uint8)), (dtype, out)


def test_all_to_all_lamport_rounds(pool):
    pool.run(_lamport_rounds)


def _race_free(ctx, seed):
    from trident import sanitize
    with sanitize.sanitizing(ctx, seed):
        # the flag algorithms (lamport: tests/algorithms.py EXCUSED says why not)
        _all_to_all_cases(ctx, algorithms.kernels("all_to_all", "all_to_all_race_free"),
                          CASES[1:3], 8, 7)
        ctx.barrier()
    return True


def test_all_to_all_race_free(pool):
    """The pairs' flags order every access (the race detector, trident/sanitize/, with
    programs of a launch run in a seeded order): several programs per pair, zero-row
    ranks, uneven splits."""
    if pool.backend != "cpu" or pool.world_size > 3:
        pytest.skip("the sanitizer runs on the CPU emulation; world 2 and 3 suffice")
    assert all(pool.run(_race_free, 3))


def _zero_row_output(ctx):
    """Issue 11: rank 0 sends 3 rows to rank 1 and receives none (was a segfault, or with
    heap views a HeapMismatchError); the other ranks take part with nothing. One rank
    sends and receives no rows at all."""
    w, me = ctx.world_size, ctx.rank
    S = [[0] * w for _ in range(w)]
    if w > 1:
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
    ranks' rows still arrive. A rank's rows to itself never pass through a slot: at one
    rank the same message is copied whole."""
    w, r = ctx.world_size, ctx.rank
    rows = CPU_SLOT_BYTES * 3 // 2 // 1024     # 1 KiB rows from rank 0 to rank 1
    S = [[1] * w for _ in range(w)]
    S[0][1 % w] = rows
    xs = rank_inputs(w, (rows + w, 1024), torch.int8, seed=11)
    xs = [x[:sum(S[s])] for s, x in enumerate(xs)]
    out = torch.zeros(sum(S[s][r] for s in range(w)), 1024, dtype=torch.int8, device=ctx.device)
    call = (lambda: ctx.all_to_all(out, xs[r].to(ctx.device), out_splits=[S[s][r] for s in range(w)],
                                   in_splits=S[r], algorithm="one_shot"))
    if w > 1 and r in (0, 1):
        with pytest.raises(ValueError, match="exceeds its scratch slot"):
            call()
    else:
        call()
    ctx.sync()
    if r > 1 or w == 1:
        assert_equal(out, torch.cat([xs[s].split(S[s])[r] for s in range(w)]), "others")


def _lamport_too_large(ctx):
    """lamport's limit is its largest block to or from a peer (half a slot: LL units).
    Even splits past it: ValueError on every rank, naming the limit and the algorithms to
    use. A block at the limit arrives. Uneven splits with one block past it (rank 0 to rank
    1): ValueError on those two ranks, before they launch anything; the others, already
    waiting for them, stop on their error (PeerFailed naming the ValueError), never a
    hang; after ctx.reset() a right call is right. Returns (this rank's error kind and
    message of the uneven call)."""
    w, r = ctx.world_size, ctx.rank
    cap = lamport.limit(ctx, "all_to_all")
    rows = cap // 1024                       # 1 KiB rows: a block at the limit
    inp = torch.ones((rows + 1) * w, 1024, dtype=torch.int8, device=ctx.device)
    with pytest.raises(ValueError, match=f"all_to_all algorithm 'lamport' takes a block to or "
                                         f"from a peer of at most {cap} bytes per rank .*; use "
                                         f"'one_shot' or 'push'"):
        ctx.all_to_all(torch.empty_like(inp), inp, algorithm="lamport")

    def call(S):
        xs = rank_inputs(w, (max(map(sum, S)), 1024), torch.int8, seed=13)
        xs = [x[:sum(S[s])] for s, x in enumerate(xs)]
        out = torch.zeros(sum(S[s][r] for s in range(w)), 1024, dtype=torch.int8,
                          device=ctx.device)
        ctx.all_to_all(out, xs[r].to(ctx.device), out_splits=[S[s][r] for s in range(w)],
                       in_splits=S[r], algorithm="lamport")
        return out, torch.cat([xs[s].split(S[s])[r] for s in range(w)])
    S = [[1] * w for _ in range(w)]
    S[0][1] = rows
    out, want = call(S)
    ctx.sync()
    assert_equal(out, want, "lamport, a block at the limit")
    S[0][1] = rows + 1
    timeout = ctx.timeout_s
    ctx.set_timeout(20.0)
    try:
        call(S)
        ctx.sync()
        got = ("no error", "")
    except Exception as exc:          # noqa: BLE001 -- the test inspects what came
        got = (type(exc).__name__, str(exc))
    finally:
        ctx.set_timeout(timeout)
    ctx.reset()
    S[0][1] = 2
    out, want = call(S)
    ctx.sync()
    assert_equal(out, want, "lamport after reset")
    return got


def test_all_to_all_aliasing_and_limits(pool):
    pool.run(_aliasing)
    if pool.backend == "cpu":              # the GPU slot is 1 MiB: too slow to fill here
        pool.run(_one_shot_too_large)
    if pool.world_size > 1:
        for rank, (kind, text) in enumerate(pool.run(_lamport_too_large)):
            if rank < 2:
                assert kind == "ValueError" and "'lamport' takes a block" in text, (rank, text)
            else:
                assert kind == PeerFailed.__name__ and "ValueError" in text, (rank, kind, text)


def _bad_inputs(ctx, algorithm):
    w = ctx.world_size
    if w > 1:       # every row count is a multiple of one
        with pytest.raises(ValueError, match="not a multiple of world size"):
            ctx.all_to_all(torch.empty(w + 1, device=ctx.device), torch.ones(w + 1, device=ctx.device))
        # named as the argument is: inp (it said "in has ... rows")
        with pytest.raises(ValueError, match=rf"all_to_all: inp has {w + 1} rows, not a "
                                             rf"multiple of world size {w}; pass in_splits"):
            ctx.all_to_all(torch.empty(w, device=ctx.device), torch.ones(w + 1, device=ctx.device))
    # an int where a sequence goes: a TypeError naming it (it was "'int' object is not
    # iterable", from the plan's key)
    with pytest.raises(TypeError, match=r"all_to_all: out_splits must be a sequence of ints "
                                        r"\(row counts, one per rank\), got 1 \(int\)"):
        ctx.all_to_all(torch.empty(w, device=ctx.device), torch.ones(w, device=ctx.device),
                       out_splits=1, in_splits=1)
    with pytest.raises(ValueError, match="in_splits must be"):
        ctx.all_to_all(torch.empty(w, device=ctx.device), torch.ones(w, device=ctx.device), out_splits=[1] * w, in_splits=[2] * w)
    with pytest.raises(TypeError, match=r"in_splits must be a sequence of ints .*got \[1.5"):
        ctx.all_to_all(torch.empty(w, device=ctx.device), torch.ones(w, device=ctx.device),
                       out_splits=[1] * w, in_splits=[1.5] + [1] * (w - 1))   # not truncated
    with pytest.raises(ValueError, match="same shape after dim 0"):
        ctx.all_to_all(torch.empty(w, 2, device=ctx.device), torch.ones(w, 3, device=ctx.device))
    # the rows a rank sends itself are checked on the host, on every rank that gets them
    # wrong (here all): at once, with or without debug mode
    in_splits = [2] * w
    in_splits[ctx.rank] = 1
    with pytest.raises(ValueError, match="differs from rank p's out_splits"):
        ctx.all_to_all(torch.empty(2 * w, device=ctx.device),
                       torch.ones(sum(in_splits), device=ctx.device), out_splits=[2] * w,
                       in_splits=in_splits, algorithm=algorithm)


def _fewer_rows_than_expected(ctx, algorithm):
    """Rank 0 sends rank 1 one row where 9 (over 5 blocks and programs) are expected. In
    debug mode every rank raises at that call -- CallMismatch where the difference was
    found, or PeerFailed where a wait stopped on it -- after no timeout (rank 1's programs
    learn from the count that travels with the rows, or from rank 0's error, that no more
    rows come); the rows rank 1 expected from rank 0 are poisoned (NaN, never 0 or stale);
    after ctx.reset() the right call is right."""
    w, r = ctx.world_size, ctx.rank
    if w == 1:
        return True
    xs = rank_inputs(w, (9 * w, 8), torch.float32, seed=19)
    in_splits = [9] * w
    if r == 0:
        in_splits[1] = 1
    out = torch.zeros(9 * w, 8, device=ctx.device)
    timeout = ctx.timeout_s
    ctx.set_timeout(20.0)
    ctx.debug = True
    t0 = time.perf_counter()
    try:
        with pytest.raises((CallMismatch, PeerFailed)) as info:
            ctx.all_to_all(out, xs[r][:sum(in_splits)].to(ctx.device), out_splits=[9] * w,
                           in_splits=in_splits, algorithm=algorithm, block=16, programs=7)
    finally:
        ctx.debug = False
        ctx.set_timeout(timeout)
    took = time.perf_counter() - t0
    assert took < 10, f"rank {r}: {took:.1f} s (a wait timed out?): {info.value}"
    assert "all_to_all" in str(info.value), info.value
    if r == 1:
        assert out[:9].isnan().all(), out[:9]
    ctx.reset()
    ctx.all_to_all(out, xs[r].to(ctx.device), out_splits=[9] * w, in_splits=[9] * w,
                   algorithm=algorithm, block=16, programs=7)
    ctx.sync()
    assert_equal(out, torch.cat([x.split(9)[r] for x in xs]), f"{algorithm} after reset")
    return True


def _splits_as_tensors(ctx, algorithm):
    """Splits given as a tensor (CPU or the device's), as numpy ints or as 0-d tensors
    give what a list of ints gives, and run its plan: no build (a tensor's elements in
    the plan's key hashed by identity, so every call built a plan)."""
    import numpy as np
    w, r = ctx.world_size, ctx.rank
    sends = [(r + p) % 3 + 1 for p in range(w)]          # rows rank r sends to rank p
    recvs = [(p + r) % 3 + 1 for p in range(w)]          # rows rank p sends to rank r
    inp = ctx.zeros(sum(sends), 4)
    inp.copy_(torch.arange(inp.numel(), dtype=torch.float32).view_as(inp) + 100 * r)
    out = ctx.zeros(sum(recvs), 4)
    ctx.all_to_all(out, inp, out_splits=recvs, in_splits=sends, algorithm=algorithm)
    ctx.sync()
    ref, builds = out.clone(), ctx.plans.builds
    forms = [(torch.tensor(recvs), torch.tensor(sends)),
             (torch.tensor(recvs, device=ctx.device), torch.tensor(sends, device=ctx.device)),
             ([np.int64(v) for v in recvs], [np.int64(v) for v in sends]),
             ([torch.tensor(v) for v in recvs], [torch.tensor(v) for v in sends])]
    for out_splits, in_splits in forms * 2:
        out.zero_()
        ctx.all_to_all(out, inp, out_splits=out_splits, in_splits=in_splits,
                       algorithm=algorithm)
        ctx.sync()
        assert torch.equal(out, ref), (type(out_splits), out, ref)
    assert ctx.plans.builds == builds, ctx.plans.builds - builds
    ctx.free(out)
    ctx.free(inp)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_all_to_all_bad_inputs(pool, algorithm):
    pool.run(_bad_inputs, algorithm)
    pool.run(_fewer_rows_than_expected, algorithm)
    pool.run(_splits_as_tensors, algorithm)


def compile_sm90() -> None:
    """Both kernels compile for sm_90 at every constexpr combination they are launched
    with, and their copies keep 16-byte accesses where the rows allow (tests/compile/sm90.py
    holds the list). Run by the test below in a process of its own (no interpreter)."""
    from tests.compile import sm90
    for k in sm90.kernels():
        if ".all_to_all." in k.label:
            for line in sm90.compile_kernel(k):
                print(line)
    print("ok")


def test_kernels_compile_for_sm90(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRIDENT_BACKEND")}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=root + os.pathsep + env.get("PYTHONPATH", ""))
    code = ("import tests.compile.sm90, tests.ccl.test_all_to_all as t; "
            "t.compile_sm90()")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]
