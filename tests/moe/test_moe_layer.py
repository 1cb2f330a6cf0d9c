"""examples/moe_layer.py at tiny size: the MoE layer on trident's dispatch/combine (router
top-k, grouped-GEMM SwiGLU experts, combine) and its all_to_all_single version both match
a dense single-process reference of the same layer, at every test world size, with rank 0
holding no tokens; both expert GEMM paths, and fp8 dispatch."""
import pytest

from ..examples import load_example


def _run(ctx, gemm, fp8):
    ex = load_example("moe_layer")
    return ex.main(ctx, ex.TINY, (6,), gemm, fp8, timing=False, check_tokens=6)


@pytest.mark.parametrize("gemm,fp8", [("grouped", False), ("loop", True)],
                         ids=["grouped-bf16", "loop-fp8"])
def test_moe_layer_matches_dense_reference(pool, gemm, fp8):
    results = pool.run(_run, gemm, fp8)
    assert results[0]["check"]["T"] == 0
    for r in results:
        assert r["gemm"] == gemm
        for layer, err in r["check"]["rel_err"].items():
            assert err < 3e-2, (r["rank"], layer, err)
