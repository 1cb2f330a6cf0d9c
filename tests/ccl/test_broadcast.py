"""broadcast: from the first and last rank, several dtypes and odd sizes, back to back;
every rank ends with the source's tensor."""
import pytest
import torch

from .refs import BLOCK, assert_equal, place, rank_inputs


def _broadcast_cases(ctx):
    cases = [(0, torch.bfloat16, (37,), False, BLOCK), (ctx.world_size - 1, torch.int16, (5, 3), True, None),
             (ctx.world_size // 2, torch.float32, (300,), False, None)]
    ts = []
    for i, (src, dtype, shape, sym, block) in enumerate(cases):   # back to back, no sync
        xs = rank_inputs(ctx.world_size, shape, dtype, seed=i)
        t = place(ctx, xs[ctx.rank], sym)
        ctx.broadcast(t, src=src, block=block)
        ts.append((t, xs[src]))
    ctx.sync()
    for (t, expected), case in zip(ts, cases):
        assert_equal(t, expected, f"broadcast {case}")
    with pytest.raises(ValueError, match="src must be a rank"):
        ctx.broadcast(torch.ones(3, device=ctx.device), src=ctx.world_size)


def test_broadcast(pool):
    pool.run(_broadcast_cases)
