"""crossover.json's reading (ops/selector.py) and auto's use of it: the nearest measured
shape within a factor of 2 decides, in the call's mode; nothing measured near falls
through to the cost model."""
from types import SimpleNamespace

import pytest

from trident.ops import auto, selector

TABLE = [
    {"op": "all_gather_matmul", "device": "H200", "world_size": 4, "M": 4096, "N": 2048,
     "K": 8192, "fused_us": 250.0, "plain_us": 300.0},
    {"op": "all_gather_matmul", "device": "H200", "world_size": 4, "M": 64, "N": 2048,
     "K": 8192, "fused_us": 40.0, "plain_us": 30.0},
]
GRAPH_TABLE = [
    # eagerly plain wins (the fused path's launch costs more host time); in a graph fused
    {"op": "matmul_all_reduce", "device": "H200", "world_size": 2, "M": 256, "N": 8192,
     "K": 2048, "fused_us": 90.0, "plain_us": 60.0, "fused_graph_us": 30.0, "plain_graph_us": 45.0},
    # no graph times: graph calls compare the eager ones
    {"op": "matmul_all_reduce", "device": "H200", "world_size": 2, "M": 8192, "N": 8192,
     "K": 2048, "fused_us": 500.0, "plain_us": 520.0},
]
BOTH = {"fused", "plain"}


@pytest.fixture
def table(monkeypatch):
    """crossover.json replaced by TABLE + GRAPH_TABLE for auto's reading."""
    monkeypatch.setattr(selector, "_table", TABLE + GRAPH_TABLE)
    return TABLE + GRAPH_TABLE


def _pick(M, S=8192, world=4, op="all_gather_matmul", graph=False, allowed=BOTH):
    return auto._from_crossover(op, "NVIDIA H200", world, M, S, graph, allowed)


def test_measured_faster_is_taken(table):
    assert _pick(4096) == "fused"
    assert _pick(64) == "plain"
    assert _pick(6000) == "fused"            # within a factor of 2 of a measured shape
    assert _pick(64, allowed={"fused"}) == "fused"      # plain cannot run here
    assert _pick(64, allowed={"sequential"}) is None    # neither measured: the next source


def test_unmeasured_falls_through(table):
    assert _pick(4096, world=2) is None
    assert _pick(4096, op="matmul_reduce_scatter") is None
    assert _pick(65536) is None              # too far from anything measured
    assert _pick(4096, S=1024) is None       # the shared size (K of all_gather_matmul) too
    assert selector.nearest("all_gather_matmul", "NVIDIA H100", 4, 4096, 8192) is None


def test_the_shared_size_is_n_for_the_row_parallel_ops():
    got = selector.nearest("matmul_all_reduce", "NVIDIA H200", 2, 256, 8192, GRAPH_TABLE)
    assert got is GRAPH_TABLE[0]
    assert selector.nearest("matmul_all_reduce", "NVIDIA H200", 2, 256, 2048,
                            GRAPH_TABLE) is None


def test_graph_calls_compare_graph_times(table):
    mar = dict(op="matmul_all_reduce", world=2)
    assert _pick(256, graph=False, **mar) == "plain"
    assert _pick(256, graph=True, **mar) == "fused"
    assert _pick(8192, graph=True, **mar) == "fused"     # falls back to the eager times
    assert selector.times(GRAPH_TABLE[1], True) == (500.0, 520.0)


def test_update_table_merges_and_rereads(tmp_path):
    path = str(tmp_path / "crossover.json")
    selector.update_table(TABLE, path)
    newer = dict(TABLE[0], fused_us=1.0)
    selector.update_table([newer, GRAPH_TABLE[0]], path)
    got = selector.load_table(path)
    assert len(got) == 3 and newer in got and TABLE[1] in got and TABLE[0] not in got


def test_auto_on_a_gpu_reads_the_crossover(table, monkeypatch):
    """choose() on a (fake) GPU context with no tuned or built-in cell takes the crossover."""
    monkeypatch.setattr(selector, "device_name", lambda ctx: "NVIDIA H200")
    monkeypatch.setattr(auto, "tuned", lambda world: (None, []))
    monkeypatch.setattr(auto, "builtin", lambda: [])
    monkeypatch.setattr(auto, "_nccl_everywhere", lambda ctx: True)
    monkeypatch.setattr(auto, "_choices", {})
    ctx = SimpleNamespace(backend="cuda", world_size=4, capturing=lambda: False,
                          nccl_available=True, ranks_per_device=1)
    monkeypatch.setattr(auto.schedules, "unavailable", lambda ctx, op, n, nccl=None: None)
    assert auto.choose(ctx, "all_gather_matmul", 4096, 2048, 8192) == "fused"
    assert auto.choose(ctx, "all_gather_matmul", 64, 2048, 8192) == "plain"
