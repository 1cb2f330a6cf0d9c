"""Fuzzing the collectives against plain torch: every algorithm (and "nccl", which is
torch.distributed), random shapes and dtypes, zero-row ranks, uneven all_to_all splits,
plain tensors, heap tensors and heap views at rank-dependent offsets (odd numbers of
elements among them, a different one on each rank), tensors that lie differently on
different ranks (on the heap on some, plain on others), in-place calls (NCCL-style
all_gather into its own block, reduce_scatter out of its own block) and aliasing
(all_to_all with out and inp overlapping must be rejected).

Seed s runs algorithm s % A of the op's A (nccl included) with dtype (s // A) % D of its
D, so that every (algorithm, dtype) pair is fuzzed at every world size; the rest is
drawn. World sizes: 2 and 3 with CI_CASES each, 4 with fewer (the emulation's 4 ranks
share 2 CPU cores in CI); TRIDENT_FUZZ_WORLD_SIZES and --cases N override."""
import random

import pytest
import torch

from .. import algorithms
from ..conftest import nccl_available, pool_worlds
from .common import fuzzed_worlds, num_cases, run_cases, run_family, skip_unless_fuzzed_world

# Bugs this fuzzer found, now fixed; their regression tests are at the end. A flag set to
# True makes the random cases steer around its bug again (for a bug under repair).
KNOWN_BUG_SHIFTED_BYTES = False     # all_gather: 1-/2-byte heap-view input at rank-dependent offsets
KNOWN_BUG_NCCL_EMPTY = False        # all_to_all "nccl": a rank with no rows to send or receive

REDUCE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ANY_DTYPES = REDUCE_DTYPES + (torch.int32, torch.int8, torch.bool, torch.int64)
TAILS = [(), (1,), (3,), (4,), (2, 3), (7,), (16,)]
WORLDS = fuzzed_worlds("2,3,4")
POOL_WORLDS = pool_worlds(WORLDS)     # the pools of this module (tests/conftest.py)
CI_CASES = {4: 40}          # cases per collective at a world size in CI; default 150
# Where a tensor lies (`_place`): the same kind on every rank, or "mixed" (per rank)
PLACES = ["plain", "plain", "heap", "shifted", "skewed", "skewed", "mixed"]
SKEWS = [0, 1, 3, 5, 7]     # elements into a heap allocation: 0 or odd, drawn per rank


def _tol(dtype):
    return 1.6e-2 if dtype == torch.bfloat16 else 2e-3 if dtype == torch.float16 else 1e-5


def _inputs(g, world, shape, dtype):
    """Every rank's input (seeded by g; identical on every rank)."""
    gen = torch.Generator().manual_seed(g.randrange(1 << 30))
    out = []
    for _ in range(world):
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=gen).to(dtype))
        elif dtype == torch.bool:
            out.append(torch.randint(0, 2, shape, generator=gen).bool())
        else:
            out.append(torch.randint(-100, 100, shape, generator=gen).to(dtype))
    return out


def _reduce(xs, op):
    acc = xs[0].float()
    for x in xs[1:]:
        acc = acc + x.float() if op == "sum" else torch.maximum(acc, x.float()) if op == "max" \
            else torch.minimum(acc, x.float())
    return acc.to(xs[0].dtype)


def _place(ctx, g, world, shape, dtype, keep):
    """A tensor of `shape` on this rank and how it lies. Every rank draws the same numbers
    and makes the same heap allocations (allocations must match across ranks; where a
    rank's view lies in them need not), then takes its own:
    plain / heap: that kind on every rank; shifted: a heap view pad * rank elements in;
    skewed: a heap view SKEWS[i] elements in, drawn for each rank (odd numbers of
    elements, a different one per rank); mixed: plain, heap or skewed, drawn for each
    rank (tensors on the heap on some ranks and not on others)."""
    where = g.choice(PLACES)
    numel = 1
    for s in shape:
        numel *= s
    if where == "plain":
        return torch.empty(shape, dtype=dtype, device=ctx.device), where
    if where == "heap":
        t = ctx.empty(*shape, dtype=dtype)
        keep.append(t)
        return t, where
    if where == "shifted":
        pad = g.randrange(1, 9)
        skews = [pad * r for r in range(world)]
    else:
        skews = [g.choice(SKEWS) for _ in range(world)]
    kinds = [g.choice(["plain", "heap", "skewed"]) for _ in range(world)] \
        if where == "mixed" else [where] * world
    big = ctx.empty(numel + max(skews), dtype=dtype)
    keep.append(big)
    kind = kinds[ctx.rank]
    what = f"{where} {kinds if where == 'mixed' else ''}{skews}"
    if kind == "plain":
        return torch.empty(shape, dtype=dtype, device=ctx.device), what
    start = 0 if kind == "heap" else skews[ctx.rank]
    return big[start:start + numel].view(shape), what


def _place_heap(ctx, shape, dtype, keep):
    t = ctx.empty(*shape, dtype=dtype)
    keep.append(t)
    return t


def _case(op, seed, ctx, dtypes):
    """(random stream, algorithm, block, dtype) of case `seed`: algorithm (the registry's,
    tests/algorithms.py) and dtype in turn (every pair once per len(names) * len(dtypes)
    seeds), the rest drawn; "auto" in place of one that does not take the dtype."""
    g = random.Random(f"{op}-{seed}")
    names = sorted(algorithms.kernels(op)) + ["nccl"]
    algorithm = names[seed % len(names)]
    dtype = dtypes[seed // len(names) % len(dtypes)]
    if algorithm == "nccl" and not ctx.nccl_available:    # ranks share a GPU: no NCCL
        algorithm = "auto"
    elif algorithm != "nccl" and not algorithms.takes(op, algorithm, dtype):
        algorithm = "auto"
    return g, algorithm, g.choice([None, None, 16, 64]), dtype


def _all_gather(ctx, seed):
    g, algorithm, block, dtype = _case("all_gather", seed, ctx, ANY_DTYPES)
    w, r = ctx.world_size, ctx.rank
    n, tail = g.choice([0, 1, 2, 3, 5, 8, 13, 40, 64]), g.choice(TAILS)
    xs = _inputs(g, w, (n, *tail), dtype)
    keep = []
    out, where = _place(ctx, g, w, (w * n, *tail), dtype, keep)
    in_place = g.random() < 0.3
    if in_place:                     # NCCL style: the input is this rank's block of out
        inp, in_where = out[r * n:(r + 1) * n], "in place"
    else:
        inp, in_where = _place(ctx, g, w, (n, *tail), dtype, keep)
        if KNOWN_BUG_SHIFTED_BYTES and in_where.startswith("shifted") \
                and dtype.itemsize < 4:
            keep.append(inp)     # see test_all_gather_shifted_byte_input
            inp, in_where = _place_heap(ctx, (n, *tail), dtype, keep), "heap"
    inp.copy_(xs[r])
    what = f"all_gather {algorithm} {dtype} n={n} tail={tail} out={where} inp={in_where} block={block}"
    ctx.all_gather(out, inp, algorithm=algorithm, block=block)
    return [(out, torch.cat(xs), what, _tol(dtype))]


def _reduce_scatter(ctx, seed):
    g, algorithm, block, dtype = _case("reduce_scatter", seed, ctx, REDUCE_DTYPES)
    w, r = ctx.world_size, ctx.rank
    n, tail = g.choice([1, 2, 3, 5, 8, 13, 40]), g.choice(TAILS)
    op = g.choice(["sum", "sum", "max", "min"])
    xs = _inputs(g, w, (w * n, *tail), dtype)
    keep = []
    inp, where = _place(ctx, g, w, (w * n, *tail), dtype, keep)
    inp.copy_(xs[r])
    in_place = g.random() < 0.2
    out, out_where = (inp[r * n:(r + 1) * n], "in place") if in_place \
        else _place(ctx, g, w, (n, *tail), dtype, keep)
    what = f"reduce_scatter {algorithm} {dtype} {op} n={n} tail={tail} inp={where} out={out_where} block={block}"
    try:
        ctx.reduce_scatter(out, inp, op=op, algorithm=algorithm, block=block)
    except ValueError as exc:
        if in_place:
            return f"rejected: {what}: {exc}"
        raise
    return [(out, _reduce(xs, op).chunk(w)[r], what, _tol(dtype) * w)]


def _all_reduce(ctx, seed):
    g, algorithm, block, dtype = _case("all_reduce", seed, ctx, REDUCE_DTYPES)
    w, r = ctx.world_size, ctx.rank
    shape = (g.choice([0, 1, 2, 5, 17, 64, 300, 1000]), *g.choice(TAILS[:4]))
    op = g.choice(["sum", "sum", "max", "min"])
    xs = _inputs(g, w, shape, dtype)
    keep = []
    t, where = _place(ctx, g, w, shape, dtype, keep)
    t.copy_(xs[r])
    what = f"all_reduce {algorithm} {dtype} {op} shape={shape} t={where} block={block}"
    ctx.all_reduce(t, op=op, algorithm=algorithm, block=block)
    return [(t, _reduce(xs, op), what, _tol(dtype) * w)]


def _all_to_all(ctx, seed):
    g, algorithm, block, dtype = _case("all_to_all", seed, ctx, ANY_DTYPES)
    w, r = ctx.world_size, ctx.rank
    tail = g.choice(TAILS)
    even = g.random() < 0.3
    if even:
        k = g.choice([0, 1, 2, 3])
        splits = [[k] * w for _ in range(w)]
    else:                                       # zeros likely: ranks that send/receive nothing
        splits = [[g.choice([0, 0, 1, 2, 3, 5]) for _ in range(w)] for _ in range(w)]
    sends = [sum(row) for row in splits]
    receives = [sum(splits[s][d] for s in range(w)) for d in range(w)]
    xs = [x[:sends[s]] for s, x in enumerate(_inputs(g, w, (max(sends + [1]), *tail), dtype))]
    keep = []
    # out and inp overlap on every rank (a rank with nothing to send or receive has no
    # overlap, runs the op and would wait for the others): must be rejected everywhere
    if g.random() < 0.05 and all(sends) and all(receives):
        big = ctx.empty(max(sends + receives) + 1, *tail, dtype=dtype)   # same on every rank
        keep.append(big)
        try:
            ctx.all_to_all(big[:receives[r]], big[:sends[r]],
                           out_splits=[splits[s][r] for s in range(w)], in_splits=splits[r],
                           algorithm=algorithm)
        except ValueError as exc:
            return f"rejected (aliasing, as it must be): {exc}"
        raise AssertionError("all_to_all accepted overlapping out and inp")
    # heap allocations must be the same on every rank: the largest size, then a view
    out, where = _place(ctx, g, w, (max(receives), *tail), dtype, keep)
    inp, in_where = _place(ctx, g, w, (max(sends), *tail), dtype, keep)
    out, inp = out[:receives[r]], inp[:sends[r]]
    inp.copy_(xs[r])
    if KNOWN_BUG_NCCL_EMPTY and algorithm == "nccl" and not (all(sends) and all(receives)):
        algorithm = "push"       # see test_all_to_all_nccl_zero_rows
    kw = {} if even else {"out_splits": [splits[s][r] for s in range(w)], "in_splits": splits[r]}
    programs = g.choice([None, None, 3, 7])     # several programs per pair (all_to_all/rows.py)
    what = (f"all_to_all {algorithm} {dtype} splits={splits} tail={tail} out={where} "
            f"inp={in_where} block={block} programs={programs}")
    ctx.all_to_all(out, inp, algorithm=algorithm, block=block, programs=programs, **kw)
    expected = torch.cat([xs[s].split(splits[s])[r] for s in range(w)])
    return [(out, expected, what, _tol(dtype))]


def _broadcast(ctx, seed):
    g, algorithm, block, dtype = _case("broadcast", seed, ctx, ANY_DTYPES)
    w, r = ctx.world_size, ctx.rank
    shape = (g.choice([0, 1, 3, 17, 100, 600]), *g.choice(TAILS[:4]))
    src = g.randrange(w)
    xs = _inputs(g, w, shape, dtype)
    keep = []
    t, where = _place(ctx, g, w, shape, dtype, keep)
    t.copy_(xs[r])
    what = f"broadcast {algorithm} {dtype} src={src} shape={shape} t={where} block={block}"
    ctx.broadcast(t, src=src, algorithm=algorithm, block=block)
    return [(t, xs[src], what, _tol(dtype))]


OPS = {"all_gather": _all_gather, "reduce_scatter": _reduce_scatter, "all_reduce": _all_reduce,
       "all_to_all": _all_to_all, "broadcast": _broadcast}


def _batch(ctx, seeds, op):
    return run_cases(ctx, OPS[op], seeds)


@pytest.mark.parametrize("op", list(OPS))
def test_fuzz_collective(pool, request, op):
    """340 cases per collective in CI (150 at 2 and 3 ranks, 40 at 4), --cases N for more."""
    skip_unless_fuzzed_world(pool, WORLDS)
    run_family(pool, _batch, num_cases(request, CI_CASES.get(pool.world_size, 150)), op)


def _shifted_byte_input(ctx, algorithm):
    """all_gather of int8 rows [2, 2, 3] from a heap view at byte offset rank * 1."""
    w, r = ctx.world_size, ctx.rank
    xs = [torch.arange(12, dtype=torch.int8).view(2, 2, 3) + 20 * s for s in range(w)]
    out = torch.zeros(2 * w, 2, 3, dtype=torch.int8, device=ctx.device)
    big = ctx.zeros(12 + w, dtype=torch.int8)
    inp = big[r:r + 12].view(2, 2, 3)
    inp.copy_(xs[r])
    ctx.all_gather(out, inp, algorithm=algorithm, block=16)
    ctx.sync()
    return torch.equal(out.cpu(), torch.cat(xs))


@pytest.mark.parametrize("algorithm", ["pull", "push"])
def test_all_gather_shifted_byte_input(pool, algorithm):
    assert all(pool.run(_shifted_byte_input, algorithm))


def _nccl_zero_rows(ctx):
    w, r = ctx.world_size, ctx.rank
    splits = [[0] * w for _ in range(w)]
    splits[0][1 % w] = 2                     # rank 0 sends 2 rows; the others send nothing
    out = torch.empty(sum(splits[s][r] for s in range(w)), 3, device=ctx.device)
    inp = torch.randn(sum(splits[r]), 3, device=ctx.device)
    ctx.all_to_all(out, inp, out_splits=[splits[s][r] for s in range(w)], in_splits=splits[r],
                   algorithm="nccl")


def test_all_to_all_nccl_zero_rows(pool):
    if not nccl_available(pool):
        pytest.skip("ranks share a GPU: NCCL cannot run there")
    pool.run(_nccl_zero_rows)


def _empty_out_at_odd_byte(ctx, algorithm):
    """all_to_all of int8 rows of 4 bytes (int32 words) where no rank sends to rank 0, whose
    out is a zero-row heap view 1 byte into an allocation (the GPU fuzz's seed 143 at world
    2): an empty tensor's data_ptr() is 0, so its word view was taken from a storage offset
    that is not whole words (RuntimeError in as_words). The others' out views, 1 byte in
    too, are staged; every rank's result is checked."""
    w, r = ctx.world_size, ctx.rank
    splits = [[0 if d == 0 else 1 + (s + d) % 2 for d in range(w)] for s in range(w)]
    xs = [torch.arange(4 * sum(splits[s]), dtype=torch.int8).view(-1, 4) + 10 * s
          for s in range(w)]
    receives = [sum(splits[s][d] for s in range(w)) for d in range(w)]
    big = ctx.zeros(4 * max(receives) + 1, dtype=torch.int8)        # same on every rank
    out = big[1:1 + 4 * receives[r]].view(receives[r], 4)
    inp = xs[r].to(ctx.device)
    ctx.all_to_all(out, inp, out_splits=[splits[s][r] for s in range(w)], in_splits=splits[r],
                   algorithm=algorithm)
    ctx.sync()
    expected = torch.cat([xs[s].split(splits[s])[r] for s in range(w)])
    return torch.equal(out.cpu(), expected)


@pytest.mark.parametrize("algorithm", ["push", "one_shot"])
def test_all_to_all_empty_out_at_an_odd_byte(pool, algorithm):
    assert all(pool.run(_empty_out_at_odd_byte, algorithm))
