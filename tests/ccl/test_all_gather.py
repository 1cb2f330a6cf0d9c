"""all_gather: push and pull, float and non-float dtypes, odd shapes, plain and heap
tensors, back to back; against torch.cat of the gathered inputs."""
import pytest
import torch

from .refs import BLOCK, assert_equal, place, rank_inputs

# (algorithm, dtype, per-rank shape, inp on the heap, block)
CASES = [
    ("push", torch.bfloat16, (37,), False, BLOCK),
    ("push", torch.int8, (5, 3), True, None),          # 15 bytes: moved as int8
    ("pull", torch.float32, (300,), False, BLOCK),
    ("pull", torch.bool, (6, 2), True, None),
    (None, torch.float16, (9, 4), False, None),          # the selector's choice
]


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
    pool.run(_all_gather_cases, CASES)


def _bad_inputs(ctx):
    inp = torch.ones(4, device=ctx.device)
    with pytest.raises(ValueError, match="out must have shape"):
        ctx.all_gather(torch.empty(4 * ctx.world_size + 1, device=ctx.device), inp)
    with pytest.raises(TypeError, match="same dtype"):
        ctx.all_gather(torch.empty(4 * ctx.world_size, dtype=torch.float16, device=ctx.device), inp)
    if ctx.world_size == 1:     # one rank cannot differ from itself
        return
    ctx.debug = True
    try:
        with pytest.raises(ValueError, match="same sizes"):
            n = 2 + ctx.rank
            ctx.all_gather(torch.empty(n * ctx.world_size, device=ctx.device), torch.ones(n, device=ctx.device))
    finally:
        ctx.debug = False


def test_all_gather_bad_inputs(pool):
    pool.run(_bad_inputs)
