"""all_gather: every algorithm of the registry (tests/algorithms.py), float and non-float
dtypes, odd shapes, plain and heap tensors, back to back; against torch.cat of the gathered
inputs. Lamport's rounds (LL units) also bit for bit, with the values a Lamport sentinel
would reserve."""
import pytest
import torch

from .. import algorithms
from .refs import BLOCK, assert_equal, place, rank_inputs

# the cases of every algorithm: (dtype, per-rank shape, inp on the heap, block)
EVERY = [(torch.bfloat16, (37,), False, BLOCK),          # odd: over several blocks
         (torch.int8, (5, 3), True, None)]               # 15 bytes: moved as int8
# an algorithm's own cases besides
OWN = {"pull": [(torch.float32, (300,), False, BLOCK), (torch.bool, (6, 2), True, None)],
       "lamport": [(torch.float32, (300,), True, 64), (torch.bool, (6, 2), False, None)]}


def cases() -> list[tuple]:
    """(algorithm, dtype, per-rank shape, inp on the heap, block): EVERY case of each
    algorithm that takes its dtype, OWN's, and one of the selector's choice (None)."""
    auto = (None, torch.float16, (9, 4), False, None)
    return algorithms.cases("all_gather", EVERY, OWN) + [auto]


def _all_gather_cases(ctx, cases):
    for i, (alg, dtype, shape, sym, block) in enumerate(cases):
        first = rank_inputs(ctx.world_size, shape, dtype, seed=i)
        second = rank_inputs(ctx.world_size, shape, dtype, seed=50 + i)
        outs = [torch.empty(ctx.world_size * shape[0], *shape[1:], dtype=dtype, device=ctx.device) for _ in range(2)]
        for x, out in zip((first, second), outs):     # back to back, no sync
            ctx.all_gather(out, place(ctx, x[ctx.rank], sym), algorithm=alg, block=block)
        ctx.sync()
        for x, out in zip((first, second), outs):
            assert_equal(out, torch.cat(x), f"{alg} {dtype} {shape}")


def test_all_gather(pool):
    pool.run(_all_gather_cases, cases())


def _lamport_rounds(ctx):
    """Lamport rounds (ccl/lamport.py, "Rounds": the counter is the context's, shared by
    every Lamport kernel): ten all-gathers back to back, sizes, dtypes (word widths) and
    grids changing every call, interleaved with the all-reduce's lamport and, once, a
    flag-protocol call; every output equal to torch.cat bit for bit (so the same on every
    rank). Then the bit patterns a Lamport sentinel reserves (-0.0, the fp32 denormal
    0x80008000, 0x8000 halves, NaNs) travel unchanged."""
    w, me = ctx.world_size, ctx.rank
    shapes = [(37, torch.float32, 16, 3), (500, torch.bfloat16, 64, 8), (5, torch.int8, 4, 2),
              (256, torch.float32, 256, 1), (129, torch.float16, 32, 5), (11, torch.int64, 4, 3)]
    calls = []
    for i in range(10):
        n, dtype, block, programs = shapes[i % len(shapes)]
        xs = rank_inputs(w, (n,), dtype, seed=500 + i)
        out = torch.empty(w * n, dtype=dtype, device=ctx.device)
        ctx.all_gather(out, place(ctx, xs[me], i % 2 == 1), algorithm="lamport", block=block,
                       programs=programs)
        if i % 3 == 0:
            t = place(ctx, rank_inputs(w, (n + 7,), torch.bfloat16, seed=600 + i)[me], False)
            ctx.all_reduce(t, algorithm="lamport", block=block, programs=programs)
        if i == 4:
            ctx.all_gather(torch.empty(64 * w, device=ctx.device),
                           torch.ones(64, device=ctx.device), algorithm="push")
        calls.append((out, torch.cat(xs), i))
    ctx.sync()
    for out, want, i in calls:
        assert torch.equal(out.cpu(), want), f"lamport round {i}"
    odd = torch.tensor([0x80008000, 0x80000000, 0x00008000, 0x7FC00001, 0xFFFFFFFF, 0x80008000],
                       dtype=torch.int64).to(torch.int32) + me
    for dtype in (torch.float32, torch.bfloat16, torch.int16, torch.uint8):
        x = odd.view(dtype).to(ctx.device)
        out = torch.empty(w * x.numel(), dtype=dtype, device=ctx.device)
        ctx.all_gather(out, x, algorithm="lamport")
        want = torch.cat([(odd - me + r).view(dtype) for r in range(w)])
        assert torch.equal(out.cpu().view(torch.uint8), want.view(torch.uint8)), (dtype, out)


def test_lamport_rounds(pool):
    pool.run(_lamport_rounds)


def _bad_inputs(ctx):
    inp = torch.ones(4, device=ctx.device)
    with pytest.raises(ValueError, match="out must have shape"):
        ctx.all_gather(torch.empty(4 * ctx.world_size + 1, device=ctx.device), inp)
    with pytest.raises(TypeError, match="same dtype"):
        ctx.all_gather(torch.empty(4 * ctx.world_size, dtype=torch.float16, device=ctx.device), inp)
    with pytest.raises(ValueError, match="inp must be at least 1-D"):
        ctx.all_gather(torch.empty(ctx.world_size, device=ctx.device), inp[0])
    if ctx.world_size == 1:     # one rank cannot differ from itself
        return
    with pytest.raises(ValueError, match="'lamport' takes a block of at most"):
        ctx.all_gather(torch.empty(ctx.world_size << 18, device=ctx.device),
                       torch.ones(1 << 18, device=ctx.device), algorithm="lamport")
    ctx.debug = True
    try:
        with pytest.raises(ValueError, match="same sizes"):
            n = 2 + ctx.rank
            ctx.all_gather(torch.empty(n * ctx.world_size, device=ctx.device), torch.ones(n, device=ctx.device))
    finally:
        ctx.debug = False


def test_all_gather_bad_inputs(pool):
    pool.run(_bad_inputs)
