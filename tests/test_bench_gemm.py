"""`trident bench gemm` cannot hang: planted candidates that never return, give wrong
values or kill their worker are reported as such (timeout / wrong / died) and every other
row is still measured and checked; a run whose budget runs out stops within it and says
what it did not reach. On the CPU emulation (two tiny shapes under the interpreter), the
same worker processes and limits as on a GPU."""
import json
import os
import time

import torch

from trident.bench import gemm as bench

HERE = "tests.test_bench_gemm"


# planted candidates: called as f(a, w) in the worker, in place of the GEMM core
def hangs(a, w):
    while True:
        time.sleep(1)


def wrong(a, w):
    return (a.float() @ w.float().T + 0.5).to(a.dtype)


def kills_its_worker(a, w):
    os._exit(3)


def _run(tmp_path, *args, planted):
    t0 = time.monotonic()
    assert bench.main(["--out-dir", str(tmp_path), *args],
                      planted={name: f"{HERE}:{name}" for name in planted}) == 0
    [path] = tmp_path.glob("gemm-*.json")
    return json.loads(path.read_text()), time.monotonic() - t0


def test_stalled_wrong_and_crashed_candidates_are_reported(tmp_path):
    result, _ = _run(tmp_path, "--timeout-s", "15",
                     planted=["hangs", "wrong", "kills_its_worker"])
    rows = result["rows"]
    shapes = {(r["M"], r["N"], r["K"]) for r in rows}
    assert len(shapes) == 2 and result["not_reached"] == []
    by = {(r["M"], r["N"], r["K"], r["impl"]): r for r in rows}
    gbps = result["hbm_read_gbps"]
    for m, n, k in shapes:
        assert by[m, n, k, "hangs"]["status"].startswith("timeout after 15 s")
        assert by[m, n, k, "wrong"]["status"].startswith("wrong: max err 0.5")
        assert by[m, n, k, "kills_its_worker"]["status"].startswith("died: the worker exited "
                                                                    "(code 3)")
        for impl in ("cublas", "interpret", "table:kdesc"):    # measured after the failures
            row = by[m, n, k, impl]
            assert row["status"] == "ok" and row["rel_err"] <= bench.TOLERANCE, row
            assert row["eager_us"] > 0 and row["vs_cublas"] > 0
            weight = n * k * 2 / (gbps * 1e3)
            assert abs(row["weight_floor_us"] - weight) <= 1e-9 * weight
            assert row["floor_us"] >= row["weight_floor_us"]
            assert abs(row["vs_floor"] - row["floor_us"] / row["eager_us"]) < 1e-9
        for impl in ("hangs", "wrong", "kills_its_worker"):
            assert by[m, n, k, impl].get("vs_cublas") is None
    assert result["worker_restarts"] == 4           # two timeouts, two crashes


def test_budget_bounds_the_run(tmp_path):
    budget = 20.0
    result, seconds = _run(tmp_path, "--budget-s", str(budget), "--timeout-s", "120",
                           planted=["hangs"])
    assert seconds < budget + 3, seconds
    assert result["not_reached"], "the budget cannot cover a candidate that never returns"
    reached = {(r["M"], r["N"], r["K"], r["impl"]) for r in result["rows"]}
    for miss in result["not_reached"]:
        names = ["cublas", "interpret", "hangs", "table:kdesc"] if miss["impls"] == "all" \
            else miss["impls"]
        assert not any((miss["M"], miss["N"], miss["K"], n) in reached for n in names)
    for r in result["rows"]:
        expected = "stopped" if r["impl"] == "hangs" else "ok"
        assert r["status"].startswith(expected), r
        if r["status"] == "ok":
            assert r["rel_err"] <= bench.TOLERANCE


def test_read_bandwidth_is_a_rate():
    gbps = bench.read_bandwidth_gbps(torch.device("cpu"), nbytes=8 << 20)
    assert 0.01 < gbps < 10_000
