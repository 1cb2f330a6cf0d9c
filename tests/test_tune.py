"""`trident tune` and its per-user cache: the command writes a table keyed by this
machine, the selector uses it from then on, and a table with another key is ignored.
Also `trident bench ccl --update-selector`, which writes the built-in tables' format.
Both measure links between GPUs, so on GPUs fewer than the ranks (ranks would share one)
they must refuse, saying why, and write nothing: that is what is checked there."""
import json
import os

import pytest

from trident.ccl import ALGORITHMS, selector, tune_cache
from trident.runtime.launch import default_backend

from .test_cli import _trident      # the command line in a subprocess, this environment

OPS = tuple(ALGORITHMS)


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """An empty per-user cache for this test (subprocesses inherit it); the selector
    forgets what it loaded."""
    monkeypatch.setenv("TRIDENT_CACHE_DIR", str(tmp_path))
    selector.reload()
    yield tmp_path
    selector.reload()


def _gpus_fewer_than(world: int) -> bool:
    """On GPUs: whether fewer than `world` are visible (ranks would share one)."""
    if default_backend() != "cuda":
        return False
    import torch
    return torch.cuda.device_count() < world


def _rows(name):
    return {mode: {op: [[None, name if name == "nccl" or name in ALGORITHMS[op] else "nccl"]]
                   for op in OPS} for mode in selector.MODES}


def _tuned_doc(eager, graph):
    return {"world_sizes": {"2": {"measured": True, "source": "test",
                                  "eager": _rows(eager)["eager"], "graph": _rows(graph)["graph"]}}}


def test_tune_command_writes_the_cache_and_the_selector_uses_it(cache):
    if _gpus_fewer_than(2):
        out = _trident("tune", "--world-size", "2", "--quick", ok=False)
        assert "tuning measures the links between GPUs: 2 ranks need 2 GPUs" in out, out
        assert not list(cache.iterdir()), "a refused tune wrote to the cache"
        return
    out = _trident("tune", "--world-size", "2", "--quick")
    key = tune_cache.machine_key(2)
    path = tune_cache.cache_path(key)
    assert os.path.exists(path) and path in out, out
    doc = json.loads(open(path).read())
    assert doc["key"] == key
    entry = doc["world_sizes"]["2"]
    assert entry["measured"] and set(entry["eager"]) == set(OPS)
    for op in OPS:
        for size in entry["sizes"]:
            for mode, graph in (("eager", False), ("graph", True)):   # CPU: graph = eager
                rows = entry.get(mode, entry["eager"])[op]
                want = next(name for lim, name in rows if lim is None or size <= lim)
                assert selector.select(op, size, 2, graph=graph) == want, (op, size, mode)
    assert selector.describe(2).startswith(f"tuned on this machine: {path}")
    info = _trident("info")
    assert "collective selection at" in info


def test_selector_uses_a_matching_cache_file_and_ignores_others(cache):
    cost = selector.select("all_reduce", 1024, 2)     # built in: measured tables or the model
    cost4 = selector.select("all_reduce", 1024, 4)
    other = "two_shot" if cost != "two_shot" else "one_shot"
    key = tune_cache.machine_key(2)
    tune_cache.write({**key, "topology": "elsewhere"}, _tuned_doc(other, "nccl"))
    tune_cache.write({**key, "gpu": "NVIDIA H100"}, _tuned_doc(other, "nccl"))
    selector.reload()
    assert selector.select("all_reduce", 1024, 2) == cost          # other machines' tables

    path = tune_cache.write(key, _tuned_doc(other, "nccl"))
    with open(path) as f:
        doc = json.load(f)
    with open(path, "w") as f:                                      # right name, wrong key
        json.dump({**doc, "key": {**key, "topology": "copied-from-elsewhere"}}, f)
    selector.reload()
    assert selector.select("all_reduce", 1024, 2) == cost

    tune_cache.write(key, _tuned_doc(other, "nccl"))
    selector.reload()
    assert selector.select("all_reduce", 1024, 2) == other
    assert selector.select("all_reduce", 1024, 2, graph=True) == "nccl"
    assert selector.select("all_reduce", 1024, 4) == cost4         # tuned for 2 ranks only
    assert "tuned on this machine" in selector.describe(2)


def test_topology_key_reads_gpu_links_only(monkeypatch):
    topo = ("\x1b[4m\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
            "GPU0\t X \tNV18\tSYS\t0-63\t0\t\tN/A\n"
            "GPU1\tNV18\t X \tNV18\t0-63\t0\t\tN/A\n"
            "GPU2\tSYS\tNV18\t X \t64-127\t1\t\tN/A\n\nLegend:\n  X    = Self\n")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert tune_cache.gpu_links(topo) == [["X", "NV18", "SYS"], ["NV18", "X", "NV18"],
                                          ["SYS", "NV18", "X"]]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    assert tune_cache.gpu_links(topo) == [["X", "SYS"], ["SYS", "X"]]


def test_bench_ccl_update_selector_writes_both_tables(tmp_path):
    target = tmp_path / "tables.json"
    args = ("bench", "ccl", "--world-size", "2", "--ops", "all_reduce", "--max-size", "1K",
            "--calls", "1", "--iters", "0", "--warmup", "0", "--out-dir", str(tmp_path),
            "--update-selector", str(target))
    if _gpus_fewer_than(2):
        out = _trident(*args, ok=False)
        assert "--update-selector: ranks share one GPU here" in out, out
        assert not target.exists()
        return
    _trident(*args)
    doc = json.loads(target.read_text())
    entry = doc["world_sizes"]["2"]
    assert entry["measured"] and entry["sizes"] == [1024]
    assert entry["eager"]["all_reduce"][-1][0] is None
    assert set(doc["world_sizes"]) >= set(selector.builtin()["world_sizes"])   # others kept
    [result] = [p for p in tmp_path.iterdir() if p.name.startswith("ccl-")
                and p.suffix == ".json"]
    rows = json.loads(result.read_text())["rows"]
    assert {"eager_us", "graph_us", "host_us", "floor_us", "eager_vs_nccl"} <= set(rows[0])
