"""examples/tp_decode.py at tiny size: the compiled tensor-parallel decode step (both
row-parallel sums) gives the single-process logits."""
import dataclasses
import importlib.util
import os
import sys

from ..conftest import WORLD_SIZES, get_pool

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "tp_decode.py")


def _example():
    spec = importlib.util.spec_from_file_location("tp_decode", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["tp_decode"] = module          # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _run(ctx, sum_with):
    ex = _example()
    shape = dataclasses.replace(ex.TINY, layers=1)
    return ex.main(ctx, shape, sum_with, iters=1)


def test_tp_decode_tiny():
    pool = get_pool(WORLD_SIZES[0])
    for sum_with in ("matmul_all_reduce", "all_reduce", "fused"):
        for r in pool.run(_run, sum_with):
            assert r["rel_err"] < 3e-2, (sum_with, r)
