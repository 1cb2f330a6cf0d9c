"""schedule="auto"'s table (trident/ops/auto.py) and `trident tune --ops` (tools/tune_ops.py):
a cell never names a schedule slower than another measured in the same run, auto takes
the fastest that can run here, and falls back to the crossovers, then the cost model."""
import json
from types import SimpleNamespace

import pytest

from trident.ops import auto, schedules
from trident.tools import tune_ops as tuning


@pytest.fixture
def fresh():
    auto.forget()
    yield
    auto.forget()


def _row(op, M, S, name, eager, graph=None):
    return dict(op=op, M=M, N=S, K=S, schedule=name, eager_us=eager, graph_us=graph)


def test_table_takes_the_fastest_of_the_same_shapes():
    op = "matmul_all_reduce"
    rows = [_row(op, 8, 8192, "sequential", 30.0, 20.0), _row(op, 16, 8192, "sequential", 40.0, 22.0),
            _row(op, 8, 8192, "epilogue", 25.0, 24.0), _row(op, 16, 8192, "epilogue", 50.0, 21.0),
            # fastest on one shape, failed on the other: not comparable, left out
            _row(op, 8, 8192, "fused", 1.0, 1.0), _row(op, 16, 8192, "fused", None, None),
            _row(op, 300, 8192, "plain", 90.0, 80.0)]
    cells = {(e["m_bucket"], e["mode"]): e for e in tuning.table(rows, "GPU X", 2)}
    eager, graph = cells[("2-16", "eager")], cells[("2-16", "graph")]
    assert "fused" not in eager["times_us"]
    assert eager["best"] == "sequential"          # geomean 34.6 against 35.4
    assert graph["best"] == "sequential"          # 20.98 against 22.45
    for e in cells.values():                      # the invariant auto relies on
        assert e["times_us"][e["best"]] == min(e["times_us"].values())
    assert cells[("257-1024", "eager")]["best"] == "plain"


def _ctx(world=2):
    return SimpleNamespace(backend="cuda", world_size=world, capturing=lambda: False)


@pytest.fixture
def gpu_like(monkeypatch, fresh):
    """choose() as on a GPU named "GPU X", NCCL on or off as the test says."""
    monkeypatch.setattr(auto.selector, "device_name", lambda ctx: "GPU X")
    state = {"nccl": True}
    monkeypatch.setattr(auto, "_nccl_everywhere", lambda ctx: state["nccl"])
    monkeypatch.setattr(auto.selector, "load_table", lambda path=None: [])
    return state


def test_choose_reads_the_tuned_cell(monkeypatch, gpu_like):
    entries = [dict(op="matmul_all_reduce", device="GPU X", world_size=2, m_bucket="2-16",
                    **{"class": "<=8192"}, mode=mode, best="plain",
                    times_us={"plain": 10.0, "epilogue": 12.0, "sequential": 14.0})
               for mode in ("eager", "graph")]
    monkeypatch.setattr(auto, "tuned", lambda world: ("tuned.json", entries))
    assert auto.choose(_ctx(), "matmul_all_reduce", 16, 8192, 1234) == "plain"
    auto._choices.clear()
    gpu_like["nccl"] = False          # ranks share a GPU: the fastest that can run
    assert auto.choose(_ctx(), "matmul_all_reduce", 16, 8192, 1234) == "epilogue"
    auto._choices.clear()
    # another bucket, class or world size: not this cell (the cost model's choice)
    for M, N, world in ((200, 8192, 2), (16, 16384, 2), (16, 8192, 4)):
        got = auto.choose(_ctx(world), "matmul_all_reduce", M, N, 1234)
        assert got == _cost_model_choice("matmul_all_reduce", M, N, world, False)


def _cost_model_choice(op, M, S, world, nccl):
    costs = {n: auto.estimate(n, op, M, S, world, False)
             for n, s in schedules.registered(op).items()
             if s.auto and (nccl or not s.needs_nccl)}
    costs = {n: t for n, t in costs.items() if t is not None}
    return min(costs, key=lambda n: (costs[n], n))


def test_crossovers_then_the_cost_model(monkeypatch, gpu_like):
    gpu_like["nccl"] = True
    monkeypatch.setattr(auto, "tuned", lambda world: (None, []))
    monkeypatch.setattr(auto, "builtin", lambda: [])
    crossover = [{"op": "matmul_reduce_scatter", "device": "GPU X", "world_size": 2, "M": 64,
                  "N": 8192, "K": 4096, "fused_us": 40.0, "plain_us": 33.0,
                  "fused_graph_us": 30.0, "plain_graph_us": 33.0}]
    monkeypatch.setattr(auto.selector, "load_table", lambda path=None: crossover)
    assert auto.choose(_ctx(), "matmul_reduce_scatter", 64, 8192, 99) == "plain"
    assert auto.choose(_ctx(), "matmul_reduce_scatter", 64, 8192, 99, graph=True) == "fused"
    # nothing measured within a factor of 2: the cost model
    assert auto.choose(_ctx(), "matmul_reduce_scatter", 1024, 8192, 99) == \
        _cost_model_choice("matmul_reduce_scatter", 1024, 8192, 2, True)


def _tune(ctx, out):
    timing = dict(calls=1, reps=1, warmup=0, synced_iters=0)
    return tuning.tune_rank(ctx, True, timing, out, ops=("matmul_all_reduce",),
                            shapes=((4,), (32,)), only=("sequential", "epilogue"))


def test_tune_writes_a_table_auto_can_read(tmp_path):
    from tests.conftest import get_pool
    out = str(tmp_path / "ops.json")
    got = get_pool(2).run(_tune, out)
    path, entries = got[0]
    assert path == out and got[1] is None
    doc = json.loads(open(out).read())
    assert doc["entries"] == json.loads(json.dumps(entries))
    # a second world size's run keeps the first one's cells in the same file
    other = json.loads(json.dumps(dict(entries[0], world_size=99)))
    doc["entries"].append(other)
    open(out, "w").write(json.dumps(doc))
    _, again = get_pool(2).run(_tune, out)[0]
    assert json.loads(open(out).read())["entries"] == [other] + json.loads(json.dumps(again))
    (cell,) = [e for e in entries if e["mode"] == "eager"]      # CPU: no graph times
    assert cell["m_bucket"] == "2-16" and cell["class"] == "<=4096"
    assert set(cell["times_us"]) == {"sequential", "epilogue"}
    assert cell["times_us"][cell["best"]] == min(cell["times_us"].values())


def test_builtin_table_is_what_the_committed_runs_give(tmp_path):
    """trident/ops/schedule_table.json is bench/schedule_table.py's output for the runs it
    names (no cell typed by hand), and on an H100 pair auto takes each cell's fastest."""
    import json
    import os
    import re
    import subprocess
    import sys
    from trident.ops import auto
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(auto.TABLE_PATH) as f:
        doc = json.load(f)
    runs = [os.path.join(root, "bench", "results", name)
            for name in re.findall(r"(ops-[\w.-]+\.json)", doc["about"])]
    assert runs, doc["about"]
    out = tmp_path / "table.json"
    subprocess.run([sys.executable, os.path.join(root, "bench", "schedule_table.py"), *runs,
                    "--out", str(out)], check=True, capture_output=True)
    assert json.loads(out.read_text())["entries"] == doc["entries"]
    for e in doc["entries"]:
        got = auto._from_cell(doc["entries"], e["op"], "NVIDIA " + e["device"] + " 80GB HBM3",
                              e["world_size"], e["m_bucket"], e["class"], e["mode"],
                              set(e["times_us"]))
        assert got == min(e["times_us"], key=lambda s: (e["times_us"][s], s)) == e["best"]
