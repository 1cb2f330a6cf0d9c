"""examples/moe_layer.py at tiny size: the MoE layer on trident's dispatch/combine (router
top-k, grouped-GEMM SwiGLU experts, combine) and its all_to_all_single version both match
a dense single-process reference of the same layer, at every test world size, with rank 0
holding no tokens; both expert GEMM paths, and fp8 dispatch. The fp8 variants run again
with uninitialised memory poisoned (tests/moe/poison.py): on a GPU it holds old data, on
the CPU zeros, so a read of an element nobody wrote would pass here and fail there."""
import pytest
import torch

from ..examples import load_example
from .poison import poisoned


def _run(ctx, gemm, fp8):
    ex = load_example("moe_layer")
    return ex.main(ctx, ex.TINY, (6,), gemm, fp8, timing=False, check_tokens=6)


def _run_poisoned(ctx, gemm, fp8):
    with poisoned(ctx):
        assert torch.empty(4).isnan().all()          # the poison is in place
        return _run(ctx, gemm, fp8)


def _check(results, gemm):
    assert results[0]["check"]["T"] == 0
    for r in results:
        assert r["gemm"] == gemm
        for layer, err in r["check"]["rel_err"].items():
            assert err < 3e-2, (r["rank"], layer, err)


@pytest.mark.parametrize("gemm,fp8", [("grouped", False), ("loop", True)],
                         ids=["grouped-bf16", "loop-fp8"])
def test_moe_layer_matches_dense_reference(pool, gemm, fp8):
    _check(pool.run(_run, gemm, fp8), gemm)


@pytest.mark.parametrize("gemm", ["loop", "grouped"])
def test_moe_layer_fp8_reads_no_unwritten_memory(pool, gemm):
    _check(pool.run(_run_poisoned, gemm, True), gemm)
