"""`trident bench ops` on the CPU emulation at 2 ranks (tiny layers): a row per schedule
the registry offers, auto with its choice, the NCCL + cuBLAS baseline (gloo here) and
torch async-TP's row saying why it did not run; every trident row checked against the
plain path before it is timed; the communication share of the plain path; the JSON's
metadata (date, device, versions) and what it did not reach within its budget."""
import json
from types import SimpleNamespace

import pytest

from trident.bench import ops, ops_norm
from trident.runtime.launch import default_backend
from trident.ops import auto, schedules

from .conftest import get_pool

TIMING = {"calls": 1, "reps": 1, "warmup": 1, "synced_iters": 0}
pytestmark = pytest.mark.skipif(default_backend() == "cuda",
                                reason="the CPU emulation's tiny layers; GPUs run bench/gpu_*.sh")


def _one_run(ctx, out_dir):
    path = ops._run(ctx, ["matmul_all_reduce", "all_gather_matmul", ops_norm.NAME], [16], [],
                    TIMING, out_dir, None, budget_s=1e9)
    late = ops._bench(ctx, ["matmul_reduce_scatter"], [64], [], TIMING, budget_s=-1.0)
    if ctx.rank != 0:
        return None
    with open(path) as f:
        return json.load(f), late


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return get_pool(2).run(_one_run, str(tmp_path_factory.mktemp("ops")))[0]


def test_rows_per_schedule_checked_then_timed(run):
    doc, _ = run
    rows = doc["rows"]
    for op in ("matmul_all_reduce", "all_gather_matmul"):
        mine = {r["impl"]: r for r in rows if r["op"] == op}
        want = {f"trident_{s}" for s in ops.schedules_of(op)} | {
            "trident_auto", "plain", "torch_symm_mem"} | (
            {"trident_epilogue_lamport"} if op != "all_gather_matmul" else set())
        assert set(mine) == want, (op, sorted(mine))
        assert {"trident_fused", "trident_sequential", "trident_pipelined"} <= set(mine)
        for name, r in mine.items():
            if name in ("torch_symm_mem", "trident_async_tp"):      # torch's async-TP
                why = "CPU" if op == "all_gather_matmul" else "no fused matmul + all-reduce"
                assert r["status"] == "not run" and why in r["note"], r
                continue
            assert r["status"] == "ok" and r["rel_err"] <= ops.TOLERANCE, r
            assert r["checked_against"] == "plain" and r["eager_us"] > 0 and r["host_us"] > 0
            assert r["eager_vs_plain"] > 0 and r["link"] == "cpu-emulation"
            assert 0 < r["comm_share"] < 1 and r["gemm_us"] > 0 and r["comm_us"] > 0
        assert mine["trident_auto"]["choice"].count("/") == 1
        assert mine["trident_auto"]["choice"].split(" / ")[0] in schedules.registered(op)
        # the schedule the auto row's calls ran is auto.choose's (the cost model on the CPU)
        r = mine["trident_auto"]
        cpu = SimpleNamespace(backend="cpu", world_size=2, capturing=lambda: False)
        assert r["choice"] == " / ".join(auto.choose(cpu, op, r["M"], r["N"], r["K"], graph=g)
                                         for g in (False, True)), r["choice"]


def test_rows_of_matmul_all_reduce_add_rmsnorm(run):
    """The one kernel, the sequential path and auto beside cuBLAS + trident's fused
    all-reduce + norm and the plain path (cuBLAS + NCCL/gloo + torch), each checked
    against the plain path's out before it is timed."""
    mine = {r["impl"]: r for r in run[0]["rows"] if r["op"] == ops_norm.NAME}
    assert set(mine) == {"trident_fused", "trident_sequential", "trident_auto",
                         "cublas+ar_norm_lamport", "plain"}, sorted(mine)
    for name, r in mine.items():
        assert r["status"] == "ok" and r["rel_err"] <= ops.TOLERANCE, r
        assert r["checked_against"] == "plain" and r["eager_us"] > 0 and r["host_us"] > 0
        assert 0 < r["comm_share"] < 1 and r["eager_vs_plain"] > 0
    assert mine["trident_auto"]["choice"] == "fused / fused"


def test_metadata_and_budget(run):
    doc, (rows, missed) = run
    for key in ("date", "device", "torch", "triton", "link", "not_reached"):
        assert doc.get(key) is not None or key == "not_reached", key
    assert doc["marked"] == "cpu-emulation" and doc["not_reached"] == []
    assert rows == [] and [m["op"] for m in missed] == ["matmul_reduce_scatter"]
    assert missed[0]["why"] == "budget"


def test_targets_name_each_miss():
    """Issue 30's targets from rows: auto against the best baseline per case and mode,
    auto over plain where communication is a third of plain or more, epilogue over
    sequential at M <= 64."""
    def row(m, impl, graph, eager, share=0.5):
        return dict(op="matmul_all_reduce", model="x", layer="y", M=m, impl=impl,
                    graph_us=graph, eager_us=eager, comm_share=share)
    rows = [dict(row(64, "trident_auto", 10, 20), choice="fused / epilogue"),
            row(64, "plain", 15, 40),
            row(64, "trident_sequential", 9, 25), row(64, "trident_epilogue", 8, 30),
            row(1024, "trident_auto", 100, 120, 0.2), row(1024, "plain", 110, 150, 0.2)]
    found = ops.targets(rows)
    graph, eager = found["graph"], found["eager"]
    assert graph["auto_vs_best_misses"] == [
        "matmul_all_reduce x y M=64: auto 10.0 us (epilogue) vs trident_sequential 9.0 "
        "(0.90x)"]
    assert eager["auto_vs_best_misses"] == []
    assert graph["comm_bound_cases"] == 1 and graph["auto_vs_plain_geomean"] == 1.5
    assert eager["auto_vs_plain_geomean"] == 2.0
    assert graph["epilogue_misses"] == [] and eager["epilogue_misses"] == [
        "matmul_all_reduce x y M=64: 0.83x"]
