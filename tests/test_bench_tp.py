"""`trident bench tp` (trident/bench/tp.py) at tiny size on the test backend: every
implementation of the row-parallel sum + residual + RMSNorm runs, step and op alone, and
the decode step agrees with the NCCL/gloo one. Where the two ranks share one GPU (a machine
with one GPU), NCCL cannot run: its rows must be there, untimed, and say why."""
import json

from trident.bench import common, tp

from .conftest import get_pool, nccl_available


def test_bench_tp_tiny(tmp_path):
    pool = get_pool(2)
    timing = {"calls": 2, "reps": 1, "warmup": 1, "synced_iters": 0}
    shape = tp.TINY
    paths = pool.run(tp._run, shape, [1, 3], list(tp.IMPLS), timing, str(tmp_path))
    with open(paths[0]) as f:
        rows = json.load(f)["rows"]
    baseline = "gloo" if pool.backend == "cpu" else "nccl"
    impls = {baseline, "trident", "trident_fused", "trident_fused_lamport",
             "trident_matmul_fused"}
    nccl_runs = nccl_available(pool)
    for batch in (1, 3):
        mine = [r for r in rows if r["batch"] == batch]
        assert {r["impl"] for r in mine if r["kind"] == "step"} >= impls
        assert any(r["impl"] == "trident_all_reduce_alone" for r in mine)
        # the GEMM + sum + norm, each way, beside the GEMM alone
        assert {r["impl"] for r in mine if r["kind"] == "linear"} >= impls | {
            "cublas_gemm_alone"}
        for r in mine:
            if r["impl"] == "nccl" and not nccl_runs:
                assert r["eager_us"] is None and r["note"] == common.NO_NCCL, r
                continue
            assert r["eager_us"] and r["eager_us"] > 0, r
            if r["rel_err"] is not None:
                assert r["rel_err"] < 3e-2, r
