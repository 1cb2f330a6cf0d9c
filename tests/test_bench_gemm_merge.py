"""`python -m trident.bench.gemm_merge`: a GPU's GEMM table from several saved runs. Per
class the candidate with the best geometric mean over every run's rows wins; a candidate
that one of the runs timing the class did not time is not chosen; a class only one run
timed is decided by it; classes no run timed stay as they were; runs of two GPU models and
unknown candidates are refused. Synthetic rows, no kernel runs."""
import json

import pytest

from trident.bench import gemm_merge
from trident.ops import gemm_tables

H200 = "NVIDIA H200"
A, B, C = "128x256x64_s3_w8", "64x256x64_s4_w4", "64x128x64_s4_w4"


def _run(tmp_path, name, rows, gpu=H200):
    path = tmp_path / f"{name}.json"
    rows = [dict(M=m, N=n, K=8192, impl=impl, vs_cublas=vs, vs_floor=vs / 2, status="ok",
                 shape_class="stale") for m, n, impl, vs in rows]
    path.write_text(json.dumps({"gpu": gpu, "hbm_read_gbps": 3900.0, "rows": rows}))
    return str(path)


def _table(tmp_path):
    path = str(tmp_path / "table.json")
    kept = gemm_tables.shape_class(8192, 8192, 8192)
    gemm_tables.update(path, gemm_tables.GpuTable(
        H200, (9, 0), classes={kept: {"config": C, "measured": True}}), {}, "test")
    return path, kept


def test_pooled_runs_decide_each_class(tmp_path):
    table, kept = _table(tmp_path)
    # M=1024: run 1 likes B (A only a little behind), run 2 likes A clearly: pooled, A wins;
    # C ran only in run 1, so it cannot win even with the best row
    one = _run(tmp_path, "one", [(1024, 8192, A, 0.95), (1024, 8192, B, 0.97),
                                 (1024, 8192, C, 1.5), (64, 8192, B, 1.0)])
    two = _run(tmp_path, "two", [(1024, 8192, A, 1.05), (1024, 8192, B, 0.96),
                                 (4096, 8192, C, 1.1)])
    written, path = gemm_merge.merge([one, two], table)
    got = gemm_tables.read(path)[1][H200].classes
    assert got[gemm_tables.shape_class(1024, 8192, 8192)]["config"] == A
    assert got[gemm_tables.shape_class(64, 8192, 8192)]["config"] == B     # run 1 alone
    assert got[gemm_tables.shape_class(4096, 8192, 8192)]["config"] == C   # run 2 alone
    assert got[kept]["config"] == C                    # no run timed it: kept
    assert got[gemm_tables.shape_class(1024, 8192, 8192)]["shapes"] == 1    # not 2 rows
    assert written.capability == (9, 0)                # the table's own
    about = gemm_tables.read(path)[1][H200].about      # says how it was made, from what
    assert "gemm_merge" in about and "one.json, two.json" in about


def test_refusals(tmp_path):
    table, _ = _table(tmp_path)
    h200 = _run(tmp_path, "h200", [(64, 8192, A, 1.0)])
    h100 = _run(tmp_path, "h100", [(64, 8192, A, 1.0)], gpu="NVIDIA H100 80GB HBM3")
    with pytest.raises(ValueError, match="one GPU model"):
        gemm_merge.merge([h200, h100], table)
    odd = _run(tmp_path, "odd", [(64, 8192, "no_such_config", 1.0)])
    with pytest.raises(ValueError, match="no_such_config"):
        gemm_merge.merge([odd], table)
    with pytest.raises(ValueError, match="--capability"):
        gemm_merge.merge([h200], str(tmp_path / "missing.json"))
