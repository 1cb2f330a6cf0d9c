"""reduce_scatter: push and pull, bf16/fp16/fp32, int8/uint8/int32/int64, sum/max/min, odd
block sizes, plain and heap tensors, back to back; against plain torch on the gathered
inputs."""
import pytest
import torch

from .refs import BLOCK, assert_equal, place, rank_inputs, reduce_ref

# (algorithm, dtype, op, per-rank output shape, inp on the heap, block)
CASES = [
    ("push", torch.float32, "sum", (37,), False, BLOCK),
    ("push", torch.bfloat16, "max", (3, 5), True, None),
    ("pull", torch.bfloat16, "sum", (150,), True, BLOCK),
    ("pull", torch.float16, "min", (7,), False, None),
    ("push", torch.int64, "sum", (3, 5), False, None),      # integers: in their own type
    ("pull", torch.int32, "max", (37,), True, BLOCK),
    ("pull", torch.int8, "sum", (9,), False, None),         # wraps around, as torch's
    ("push", torch.uint8, "min", (7,), True, BLOCK),
]


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
    pool.run(_reduce_scatter_cases, CASES)


def _bad_inputs(ctx):
    with pytest.raises(ValueError, match="inp must have shape"):
        ctx.reduce_scatter(torch.empty(4, device=ctx.device), torch.ones(4 * ctx.world_size + 2, device=ctx.device))
    with pytest.raises(TypeError, match="int32 and int64, got torch.float64"):
        ctx.reduce_scatter(torch.empty(4, dtype=torch.float64, device=ctx.device),
                           torch.ones(4 * ctx.world_size, dtype=torch.float64, device=ctx.device))


def test_reduce_scatter_bad_inputs(pool):
    pool.run(_bad_inputs)
