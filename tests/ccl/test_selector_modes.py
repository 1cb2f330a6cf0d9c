"""The collective selector's two tables (eager and CUDA graph), its fallback for world
sizes that were not measured, and tables derived from benchmark rows."""
import json
import random

import pytest

from trident.runtime import _env
from trident.bench import selection
from trident.ccl import ALGORITHMS, selector, tune_cache

OPS = tuple(ALGORITHMS)


def _doc(entries: dict) -> dict:
    """A tables document from {world size: entry}; entries are measured unless they say."""
    return {"world_sizes": {str(w): {"measured": True, "source": f"test, world size {w}", **e}
                            for w, e in entries.items()}}


@pytest.fixture
def on_gpu(monkeypatch, tmp_path):
    """Select as a GPU process would (built-in GPU rows apply), with an empty cache."""
    monkeypatch.setattr(_env, "INTERPRET", False)
    monkeypatch.setattr(tune_cache, "gpu_name", lambda: "NVIDIA H200")
    monkeypatch.setenv("TRIDENT_CACHE_DIR", str(tmp_path))
    selector.reload()
    yield
    selector.reload()


def test_graph_calls_read_the_graph_table():
    doc = _doc({2: {"eager": {"all_reduce": [[4096, "one_shot"], [None, "nccl"]]},
                    "graph": {"all_reduce": [[1 << 20, "one_shot"], [None, "two_shot"]]}}})
    assert selector.select("all_reduce", 4096, 2, table=doc) == "one_shot"
    assert selector.select("all_reduce", 8192, 2, table=doc) == "nccl"
    assert selector.select("all_reduce", 8192, 2, table=doc, graph=True) == "one_shot"
    assert selector.select("all_reduce", 4 << 20, 2, table=doc, graph=True) == "two_shot"


def test_missing_graph_rows_use_the_eager_ones_and_missing_ops_the_cost_model():
    doc = _doc({2: {"eager": {"broadcast": [[None, "nccl"]]}}})
    assert selector.select("broadcast", 1 << 30, 2, table=doc, graph=True) == "nccl"
    cost = selector.builtin()["cost_model"]["eager"]["all_to_all"]
    assert selector.select("all_to_all", 1024, 2, table=doc) == cost[0][1]


def test_unmeasured_world_size_uses_the_nearest_measured_one_and_says_so():
    doc = _doc({2: {"eager": {"all_gather": [[None, "push"]]}},
                8: {"eager": {"all_gather": [[None, "pull"]]}},
                4: {"measured": False, "eager": {"all_gather": [[None, "nccl"]]}}})
    assert selector.select("all_gather", 1024, 2, table=doc) == "push"
    assert selector.select("all_gather", 1024, 3, table=doc) == "push"
    assert selector.select("all_gather", 1024, 4, table=doc) == "push"   # a guess is not used
    assert selector.select("all_gather", 1024, 5, table=doc) == "pull"   # a tie: the larger
    note = selector.tables_for(6, doc, "given").source
    assert "world size 6 NOT measured" in note and "world size 8's rows" in note


def test_builtin_tables_are_well_formed():
    doc = selector.builtin()
    entries = [*doc["world_sizes"].values(), doc["cost_model"]]
    for entry in entries:
        for mode in selector.MODES:
            for op in OPS:
                rows = entry[mode][op]
                limits = [lim for lim, _ in rows]
                assert limits[-1] is None and all(isinstance(x, int) for x in limits[:-1])
                assert limits[:-1] == sorted(limits[:-1])
                for _, name in rows:
                    assert name == "nccl" or name in ALGORITHMS[op], (op, name)
    assert all(entry["measured"] for entry in doc["world_sizes"].values())
    assert not doc["cost_model"]["measured"]


def test_cpu_emulation_uses_the_cost_model_not_gpu_rows(monkeypatch, tmp_path):
    monkeypatch.setenv("TRIDENT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_env, "INTERPRET", True)
    selector.reload()
    cost = selector.builtin()["cost_model"]
    for w in (2, 4, 8):
        for op in OPS:
            assert selector.select(op, 1024, w) == cost["eager"][op][0][1]
    assert "cost model" in selector.describe(4)
    selector.reload()


def test_gpu_without_rows_for_its_world_size_falls_back(on_gpu):
    measured = sorted(int(w) for w in selector.builtin()["world_sizes"])
    unmeasured = next(w for w in range(2, 9) if w not in measured)
    near = min(measured, key=lambda m: (abs(m - unmeasured), -m))
    rows = selector.builtin()["world_sizes"][str(near)]
    for op in OPS:
        for mode in selector.MODES:
            want = rows[mode][op][0][1]
            assert selector.select(op, 1, unmeasured, graph=mode == "graph") == want
    assert f"world size {unmeasured} NOT measured" in selector.describe(unmeasured)


def _bench_rows(rng):
    """Rows as `trident bench ccl` writes them: one_shot wins small sizes eagerly, nccl
    large ones; in a graph one_shot wins up to 16 KiB and two_shot beyond."""
    rows = []
    for size in (1024, 4096, 16384, 65536):
        small = size <= 4096
        times = {"trident_one_shot": (10 if small else 60, 5),
                 "trident_two_shot": (70, 9 if size <= 16384 else 4),
                 "trident_auto": (1, 1),               # the selector itself: never a candidate
                 "nccl": (40, 20), "torch_two_shot": (2, 2)}
        for impl, (eager, graph) in times.items():
            jitter = 1 + rng.random() * 0.01
            rows.append({"op": "all_reduce", "bytes": size, "impl": impl,
                         "eager_us": eager * jitter, "graph_us": graph * jitter})
    return rows


def test_tables_derived_from_bench_rows(tmp_path):
    rows = _bench_rows(random.Random(0))
    meta = {"device": "2x NVIDIA H200", "date": "2026-11-22", "torch": "2.11", "triton": "3.6"}
    entry = selection.entry(rows, ["all_reduce"], meta, 50)
    assert entry["eager"]["all_reduce"] == [[4096, "one_shot"], [None, "nccl"]]
    assert entry["graph"]["all_reduce"] == [[16384, "one_shot"], [None, "two_shot"]]
    assert "2x NVIDIA H200" in entry["source"] and entry["measured"]
    path = selection.merge(str(tmp_path / "tables.json"), 2, entry)
    doc = json.loads(open(path).read())
    assert set(doc["world_sizes"]) >= {"2", *selector.builtin()["world_sizes"]}
    assert selector.select("all_reduce", 2048, 2, table=doc) == "one_shot"
    assert selector.select("all_reduce", 8192, 2, table=doc) == "nccl"
    assert selector.select("all_reduce", 8192, 2, table=doc, graph=True) == "one_shot"
    assert selector.select("all_reduce", 1 << 20, 2, table=doc, graph=True) == "two_shot"


def test_sizes_with_no_graph_time_leave_the_graph_table_out():
    rows = [{**r, "graph_us": None} for r in _bench_rows(random.Random(1))]
    entry = selection.entry(rows, ["all_reduce"], {"device": "cpu", "date": "d", "torch": "t",
                                                   "triton": "t"}, 2)
    assert "graph" not in entry and "not measured" in entry["source"]
    assert selection.describe_rows(entry["eager"]["all_reduce"]) == \
        "<= 4 KiB one_shot, larger nccl"


def _auto_passes_over_what_does_not_fit(ctx):
    """A table that names lamport for every size: "auto" runs it where it fits and takes
    the dtype, and one_shot where the message is past its capacity or integer."""
    import torch
    from trident.ccl import lamport
    from trident.runtime.plans import tensor_key
    rows = [[None, "lamport"]]
    tables = selector.Tables({"eager": {"all_reduce": rows}, "graph": {"all_reduce": rows}},
                             selector.builtin()["cost_model"], "test: lamport everywhere")
    saved, capacity = selector._active.get(ctx.world_size), lamport.capacity
    selector._active[ctx.world_size] = tables
    cap = 4096                    # as with a small heap: a message past it stays small here
    lamport.capacity = lambda heap_size, world_size: cap
    try:
        ran = {}
        for name, t in (("small", torch.arange(300.0, device=ctx.device)),     # exact sums
                        ("past capacity", torch.arange(cap / 4 + 64, device=ctx.device)),
                        ("integers", torch.arange(300, dtype=torch.int32, device=ctx.device))):
            want = t * ctx.world_size
            ctx.all_reduce(t)
            ctx.sync()
            assert torch.equal(t, want), name
            plan = ctx.plans._get(("all_reduce", tensor_key(t), "sum", "auto", None, None, (),
                                   False))
            ran[name] = plan.name
    finally:
        lamport.capacity = capacity
        if saved is None:
            selector._active.pop(ctx.world_size, None)
        else:
            selector._active[ctx.world_size] = saved
    return ran


def test_auto_passes_over_an_algorithm_a_message_does_not_fit(pool):
    if pool.world_size == 1:
        pytest.skip("one rank launches nothing")
    for ran in pool.run(_auto_passes_over_what_does_not_fit):
        assert ran == {"small": "lamport", "past capacity": "one_shot", "integers": "one_shot"}
