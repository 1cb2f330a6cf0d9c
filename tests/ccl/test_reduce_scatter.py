"""reduce_scatter: every algorithm of the registry (tests/algorithms.py), bf16/fp16/fp32,
int8/uint8/int32/int64 (where the algorithm takes them: not lamport), sum/max/min, odd
block sizes, plain and heap tensors, back to back; against plain torch on the gathered
inputs. Lamport's rounds also against the all-reduce's, bit for bit."""
import pytest
import torch

from .. import algorithms
from .refs import BLOCK, assert_equal, place, rank_inputs, reduce_ref

# the cases of every algorithm: (dtype, op, per-rank output shape, inp on the heap,
# block); integers reduce in their own type
EVERY = [(torch.float32, "sum", (37,), False, BLOCK), (torch.bfloat16, "max", (3, 5), True, None),
         (torch.int32, "max", (37,), True, BLOCK)]
# an algorithm's own cases besides: int8 sums wrap around, as torch's
OWN = {"push": [(torch.int64, "sum", (3, 5), False, None), (torch.uint8, "min", (7,), True, BLOCK)],
       "pull": [(torch.bfloat16, "sum", (150,), True, BLOCK),
                (torch.float16, "min", (7,), False, None), (torch.int8, "sum", (9,), False, None)],
       "lamport": [(torch.float16, "min", (7,), False, 16),
                   (torch.bfloat16, "sum", (1025,), True, 256)]}


def cases() -> list[tuple]:
    """(algorithm, dtype, op, per-rank output shape, inp on the heap, block): EVERY case
    of each algorithm that takes its dtype, and OWN's."""
    return algorithms.cases("reduce_scatter", EVERY, OWN)


def _reduce_scatter_cases(ctx, cases):
    for i, (alg, dtype, op, shape, sym, block) in enumerate(cases):
        full = (ctx.world_size * shape[0], *shape[1:])
        first = rank_inputs(ctx.world_size, full, dtype, seed=i)
        second = rank_inputs(ctx.world_size, full, dtype, seed=70 + i)
        outs = [torch.empty(shape, dtype=dtype, device=ctx.device) for _ in range(2)]
        for x, out in zip((first, second), outs):     # back to back, no sync
            ctx.reduce_scatter(out, place(ctx, x[ctx.rank], sym), op=op, algorithm=alg,
                               block=block)
        ctx.sync()
        for x, out in zip((first, second), outs):
            expected = reduce_ref(x, op).chunk(ctx.world_size)[ctx.rank]
            assert_equal(out, expected, f"{alg} {dtype} {op} {shape}")


def test_reduce_scatter(pool):
    pool.run(_reduce_scatter_cases, cases())


def _lamport_rounds(ctx):
    """Lamport rounds (ccl/lamport.py, "Rounds"; the counter is the context's, shared by
    every Lamport kernel): ten reduce-scatters back to back, sizes, dtypes and grids
    changing every call, each followed by the all-reduce's lamport on the same input and a
    flag-protocol call in between. Each rank's block must equal the all-reduce's block bit
    for bit (both reduce in fp32 in rank order), and plain torch's within rounding."""
    w, me = ctx.world_size, ctx.rank
    shapes = [(37, torch.float32, 16, 3), (500, torch.bfloat16, 64, 8),
              (5, torch.float16, 4, 2), (256, torch.float32, 256, 1), (129, torch.bfloat16, 32, 5)]
    calls = []
    for i in range(10):
        n, dtype, block, programs = shapes[i % len(shapes)]
        xs = rank_inputs(w, (w * n,), dtype, seed=400 + i)
        out = torch.empty(n, dtype=dtype, device=ctx.device)
        ctx.reduce_scatter(out, place(ctx, xs[me], i % 2 == 1), algorithm="lamport",
                           block=block, programs=programs)
        twin = place(ctx, xs[me], i % 2 == 0)
        ctx.all_reduce(twin, algorithm="lamport", block=2 * block, programs=programs)
        if i == 4:
            ctx.reduce_scatter(torch.empty(64, device=ctx.device),
                               torch.ones(64 * w, device=ctx.device), algorithm="push")
        calls.append((out, twin, xs, i))
    ctx.sync()
    for out, twin, xs, i in calls:
        n = out.numel()
        assert_equal(out, reduce_ref(xs, "sum")[me * n:(me + 1) * n], f"lamport round {i}")
        assert torch.equal(out.cpu(), twin[me * n:(me + 1) * n].cpu()), f"round {i}: not the all-reduce's"
    if w > 1:       # NaN and signed zeros travel as values (a 16-bit -0.0 as +0.0)
        x = torch.tensor([float("nan"), -0.0, 1.5, -0.0] * w, dtype=torch.bfloat16)
        out = torch.empty(4, dtype=torch.bfloat16, device=ctx.device)
        ctx.reduce_scatter(out, x.to(ctx.device), algorithm="lamport")
        got = out.float().cpu()
        assert torch.isnan(got[0]) and got[2] == 1.5 * w and not torch.signbit(got[1]), got


def test_lamport_rounds(pool):
    pool.run(_lamport_rounds)


def _bad_inputs(ctx):
    with pytest.raises(ValueError, match="inp must have shape"):
        ctx.reduce_scatter(torch.empty(4, device=ctx.device), torch.ones(4 * ctx.world_size + 2, device=ctx.device))
    with pytest.raises(TypeError, match="int32 and int64, got torch.float64"):
        ctx.reduce_scatter(torch.empty(4, dtype=torch.float64, device=ctx.device),
                           torch.ones(4 * ctx.world_size, dtype=torch.float64, device=ctx.device))
    with pytest.raises(TypeError, match="lamport"):      # its sentinel is a float's
        ctx.reduce_scatter(torch.empty(4, dtype=torch.int32, device=ctx.device),
                           torch.ones(4 * ctx.world_size, dtype=torch.int32, device=ctx.device),
                           algorithm="lamport")
    if ctx.world_size > 1:      # one rank launches nothing, so it takes any size
        with pytest.raises(ValueError, match="'lamport' takes an output of at most"):
            ctx.reduce_scatter(torch.empty(1 << 19, device=ctx.device),
                               torch.ones(ctx.world_size << 19, device=ctx.device),
                               algorithm="lamport")


def test_reduce_scatter_bad_inputs(pool):
    pool.run(_bad_inputs)
