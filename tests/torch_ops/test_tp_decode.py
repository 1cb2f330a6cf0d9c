"""examples/tp_decode.py at tiny size: the compiled tensor-parallel decode step (both
row-parallel sums) gives the single-process logits."""
import dataclasses

from ..conftest import WORLD_SIZES, get_pool
from ..examples import load_example


def _run(ctx, sum_with):
    ex = load_example("tp_decode")
    shape = dataclasses.replace(ex.TINY, layers=1)
    return ex.main(ctx, shape, sum_with, iters=1)


def test_tp_decode_tiny():
    pool = get_pool(WORLD_SIZES[0])
    for sum_with in ("matmul_all_reduce", "all_reduce", "fused"):
        for r in pool.run(_run, sum_with):
            assert r["rel_err"] < 3e-2, (sum_with, r)
