"""The selector: fused only where the nearest measured shape says fused was faster."""
from types import SimpleNamespace

from trident.ops import selector

TABLE = [
    {"op": "all_gather_matmul", "device": "H200", "world_size": 4, "M": 4096, "N": 2048,
     "K": 8192, "fused_us": 250.0, "plain_us": 300.0},
    {"op": "all_gather_matmul", "device": "H200", "world_size": 4, "M": 64, "N": 2048,
     "K": 8192, "fused_us": 40.0, "plain_us": 30.0},
]


def _choose(M, N=2048, K=8192, world=4, op="all_gather_matmul"):
    ctx = SimpleNamespace(backend="cuda", world_size=world)
    real = selector.device_name
    selector.device_name = lambda c: "NVIDIA H200"
    try:
        return selector.select(ctx, op, M, N, K, table=TABLE)
    finally:
        selector.device_name = real


def test_measured_faster_is_fused_and_slower_is_plain():
    assert _choose(4096) == "fused"
    assert _choose(64) == "plain"
    assert _choose(6000) == "fused"          # within a factor of 2 of a measured shape


def test_unmeasured_is_plain():
    assert _choose(4096, world=2) == "plain"
    assert _choose(4096, op="matmul_reduce_scatter") == "plain"
    assert _choose(65536) == "plain"         # too far from anything measured
    assert _choose(4096, K=1024) == "plain"


GRAPH_TABLE = [
    # eagerly plain wins (the fused path's launch costs more host time); in a graph fused
    {"op": "matmul_all_reduce", "device": "H200", "world_size": 2, "M": 256, "N": 8192,
     "K": 2048, "fused_us": 90.0, "plain_us": 60.0, "fused_graph_us": 30.0, "plain_graph_us": 45.0},
    # no graph times: graph calls compare the eager ones
    {"op": "matmul_all_reduce", "device": "H200", "world_size": 2, "M": 8192, "N": 8192,
     "K": 2048, "fused_us": 500.0, "plain_us": 520.0},
]


def _choose_mode(M, graph=None, capturing=False):
    ctx = SimpleNamespace(backend="cuda", world_size=2, capturing=lambda: capturing)
    real = selector.device_name
    selector.device_name = lambda c: "NVIDIA H200"
    try:
        return selector.select(ctx, "matmul_all_reduce", M, 8192, 2048, table=GRAPH_TABLE,
                               graph=graph)
    finally:
        selector.device_name = real


def test_graph_calls_compare_graph_times():
    assert _choose_mode(256, graph=False) == "plain"
    assert _choose_mode(256, graph=True) == "fused"
    assert _choose_mode(256, capturing=True) == "fused"     # default: is the stream capturing
    assert _choose_mode(256, capturing=False) == "plain"
    assert _choose_mode(8192, graph=True) == "fused"        # falls back to the eager times
