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


def test_stalled_wrong_and_crashed_candidates_are_reported(tmp_path, monkeypatch):
    """The bounded bench's handling of a candidate that stalls, is wrong or kills its
    worker, on the bench's two-shape interpreter path everywhere. On a GPU the bench runs
    its whole shape sweep, where the stalled candidate alone costs 15 s per shape: this
    test ran past 360 s on an H200, most likely for that. The stall and crash handling
    is the same code on both devices (trident/bench/bounded.py)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")     # read by bench._device and the workers
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
            hbm = 2 * (m * k + n * k + m * n) / (gbps * 1e3)      # A, W and C once
            assert abs(row["hbm_floor_us"] - hbm) <= 1e-9 * hbm
            assert row["floor_us"] >= row["hbm_floor_us"]
            assert abs(row["vs_floor"] - row["floor_us"] / row["eager_us"]) < 1e-9
            assert row["of_floor"] == row["vs_floor"]
            # cuBLAS's time from the same run, beside every row
            cub = by[m, n, k, "cublas"]
            assert row["cublas_eager_us"] == cub["eager_us"]
            assert abs(row["cublas_of_floor"] - row["floor_us"] / cub["eager_us"]) < 1e-9
            assert abs(row["vs_cublas_eager"] - cub["eager_us"] / row["eager_us"]) < 1e-9
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


def test_table_of_a_run(tmp_path):
    """--update-table's table from measured rows: per class the best geometric mean of
    vs_cublas, a plain fused_config beside a swap-AB winner, only measured classes; written
    into a folder as the model's own file (gemm_table_h100.json), and the H100 then picks
    its own table beside the package's H200 one."""
    from trident.ops import gemm, gemm_tables

    def row(m, impl, vs):
        return dict(M=m, N=8192, K=8192, impl=impl, vs_cublas=vs, vs_floor=vs * 0.9,
                    shape_class=gemm_tables.shape_class(m, 8192, 8192))
    rows = [row(64, "cublas", 1.0), row(64, "swab128x64x64_s6_w4_sk8", 1.1),
            row(64, "64x128x64_s4_w4_sk8", 0.8), row(64, "128x128x64_s4_w8_sk8", 0.9),
            row(64, "table:kdesc", 2.0), row(8192, "128x256x64_s3_w8", 0.99),
            row(8192, "swab128x64x64_s6_w4_sk8", 0.5)]
    best = bench.summarize(rows)
    assert set(best) == {"m64-nbig-kbig", "mbig-nbig-kbig"}
    result = dict(device="NVIDIA H100 80GB HBM3", capability=(9, 0), hbm_read_gbps=3200.0)
    table = bench.gpu_table(result, best, gemm.CANDIDATES, 2, "2026-11-24")
    small = table.classes["m64-nbig-kbig"]
    assert small["config"] == "swab128x64x64_s6_w4_sk8" and small["geomean_vs_cublas"] == 1.1
    assert small["fused_config"] == "128x128x64_s4_w8_sk8" and small["geomean_vs_floor"] == 0.99
    assert table.classes["mbig-nbig-kbig"] == {
        "config": "128x256x64_s3_w8", "measured": True, "geomean_vs_cublas": 0.99,
        "geomean_vs_floor": 0.891, "shapes": 1, "date": "2026-11-24"}
    table, path = bench.write_table(str(tmp_path), dict(result), best, gemm.CANDIDATES, 2)
    assert path == str(tmp_path / "gemm_table_h100.json")     # a folder: the model's file
    _, mine = gemm_tables.read(path)
    assert sorted(mine) == ["NVIDIA H100 80GB HBM3"]
    # beside the package's tables (which hold a measured H100 table too: this run's wins)
    tables = {**gemm_tables.read()[1], **mine}
    h100 = gemm_tables.pick(tables, "NVIDIA H100 80GB HBM3", (9, 0))
    assert h100.capability == (9, 0) and h100.m_edges == gemm_tables.M_EDGES
    assert h100.entry(1, 8192, 16384)["config"] == "swab128x64x64_s6_w4_sk8"
    assert h100.entry(1024, 8192, 16384)["config"] == "128x256x64_s3_w8"   # nearest: mbig


def test_table_keep_classes(tmp_path):
    """--update-table with --keep-classes: a run over some M writes its classes into the
    file's table of that GPU and keeps the rest of it; without, the table is the run's."""
    from trident.ops import gemm, gemm_tables

    def row(m, impl, vs):
        return dict(M=m, N=8192, K=8192, impl=impl, vs_cublas=vs, vs_floor=vs * 0.9,
                    shape_class=gemm_tables.shape_class(m, 8192, 8192))
    result = dict(device="NVIDIA H100 80GB HBM3", capability=(9, 0), hbm_read_gbps=3200.0)
    first = bench.summarize([row(8192, "128x256x64_s3_w8", 0.99), row(128, "64x128x64_s4_w4", 0.8)])
    bench.write_table(str(tmp_path), dict(result), first, gemm.KNOWN, 2)
    mid = bench.summarize([row(128, "128x128x64_s4_w8_streamk", 0.97)])
    _, path = bench.write_table(str(tmp_path), dict(result), mid, gemm.KNOWN, 2,
                                keep_classes=True)
    classes = gemm_tables.read(path)[1]["NVIDIA H100 80GB HBM3"].classes
    assert classes["m128-nbig-kbig"]["config"] == "128x128x64_s4_w8_streamk"
    assert classes["mbig-nbig-kbig"]["config"] == "128x256x64_s3_w8"
    bench.write_table(str(tmp_path), dict(result), mid, gemm.KNOWN, 2)
    assert sorted(gemm_tables.read(path)[1]["NVIDIA H100 80GB HBM3"].classes) == \
        ["m128-nbig-kbig"]
