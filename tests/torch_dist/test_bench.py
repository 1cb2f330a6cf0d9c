"""trident/bench/torch_backend.py in brief, in the test ranks: its host rows are there and
sane (a warm dist.all_reduce on a heap tensor neither builds a plan nor synchronises,
and the backend's layer costs a few microseconds at most, generously bounded for a loaded
machine), its device rows have the project's columns (eager and host; no graph column on
the CPU emulation, and the JSON says why; NCCL's row skipped with its reason), its JSON
carries the run's metadata, and its TP MLP step over trident gives the baseline group's
output."""
import json

import pytest

from trident.bench.torch_backend import NO_GRAPH, SUITE, run, summary, timing

TRIDENT_ROWS = ("ctx.all_reduce heap", "ctx.all_reduce plain", "dist.all_reduce heap",
                "dist.all_reduce plain")


def test_bench_rows(tpool, tmp_path):
    if tpool.world_size != 2:
        pytest.skip("one world is enough")
    path = str(tmp_path / "torch-backend.json")
    rows = tpool.run(run, 400, 50, (4, 16, 32), 1, path)[0]
    layer = rows["group.allreduce heap"]["ns"] - rows["ctx.all_reduce heap"]["ns"]
    assert 0 < rows["ctx.all_reduce heap"]["ns"] < rows["dist.all_reduce heap"]["ns"], rows
    assert layer < 20_000, f"the backend's layer took {layer:.0f} ns per call"
    base = "nccl" if "tp mlp step nccl" in rows else "gloo"     # NCCL where each rank has a GPU
    assert rows[f"tp mlp output rel err (trident vs {base})"]["value"] < 1e-5, rows
    text = summary(rows)
    assert "dist.all_reduce - ctx.all_reduce" in text and "eager_us: " in text, text

    with open(path) as f:
        doc = json.load(f)
    for key in ("date", "device", "torch", "triton", "world_size", "marked"):
        assert doc.get(key), (key, doc)
    assert doc["suite"] == SUITE and doc["world_size"] == 2 and doc["date"][:2] == "20"
    cpu = tpool.backend == "cpu"
    nccl = doc["rows"]["modes dist.all_reduce nccl plain"]
    if cpu:
        assert "cpu-emulation" in doc["device"] and "cpu-emulation" in doc["marked"]
        assert doc["graph"] == NO_GRAPH and "no NCCL" in doc["nccl_baseline"]
    else:         # GPUs: a graph column everywhere; NCCL's row where each rank has a GPU
        assert "graph" not in doc and "cpu-emulation" not in doc["device"], doc
    assert doc["rows"] == json.loads(json.dumps(rows))       # the rows returned, as written
    for name in TRIDENT_ROWS:          # eager and host, measured; graph only on GPUs
        r = doc["rows"][f"modes {name}"]
        assert ("graph_us" in r) != cpu and r["calls"] == timing(not cpu)["calls"], (name, r)
        assert 0 < r["host_us"] <= r["eager_us"] * 1.5, (name, r)
    if nccl["eager_us"] is None:       # the CPU, or ranks sharing a GPU: skipped, saying why
        assert "NCCL" in nccl["note"] and nccl.get("graph_us") is None, nccl
        assert "NCCL" in doc["nccl_baseline"], doc["nccl_baseline"]
    else:
        assert not cpu and nccl["eager_us"] > 0 and nccl["graph_us"] > 0, nccl
    step = doc["rows"]["tp mlp step trident"]
    assert step["fallbacks_per_step"] == 0 and step["plan_builds_per_step"] >= 0, step
    # the host rows and the TP rows of older files keep their fields
    assert set(doc["rows"]["dist.all_reduce plain"]) == {"ns", "median_ns"}
    assert {"ms", "shape"} <= set(step) and set(doc["rows"][f"tp mlp step {base}"]) >= {"ms", "shape"}
