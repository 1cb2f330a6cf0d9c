"""The warm path's host time (trident/bench/host.py), briefly, at world 2: a warm call
must not rebuild its plan, make a host collective, synchronise, or run torch ops beyond
its output's allocation; and its Python must stay within a generous time bound (loose
enough for 2 loaded cores: it catches a plan rebuilt per call, a host sync or an
allocation explosion, not a 10% slip)."""
import pytest

from trident.bench import host

from ..conftest import BACKEND, get_pool

# cases of every kind: a collective (heap, staged, splits), a fused op with and without
# out, MoE dispatch (both modes) and combine
CASES = ["all_reduce one_shot 1KiB heap", "all_reduce two_shot 1KiB staged",
         "all_gather pull 1KiB staged", "all_to_all push splits heap", "broadcast push",
         "all_gather_matmul out", "moe dispatch", "moe combine out=None"]
BOUND_NS = 100_000          # the figures are 1-10 us per call on an idle core
TORCH_OPS = {"out=None": 1}  # a fresh output per call; everything else: none


@pytest.mark.skipif(BACKEND != "cpu", reason="the harness stubs the kernels of the CPU "
                    "emulation; on GPUs `trident bench` measures the host time per call")
def test_warm_calls_are_cheap():
    results = host.run(calls=500, batch=50, only=CASES, pool=get_pool(2))
    names = [n for n in results if n[0] not in "bl"]     # not baseline / launch-python
    assert len(names) >= len(CASES), sorted(results)
    for name in names:
        r = results[name]
        assert r["builds"] == 0, f"{name}: a warm call built a plan ({r})"
        assert r["host_collectives"] == 0, f"{name}: a warm call made a host collective"
        assert r["syncs"] == 0, f"{name}: a warm call synchronised ({r})"
        ops = next((v for k, v in TORCH_OPS.items() if k in name), 0)
        assert r["torch_ops"] <= ops, f"{name}: {r['torch_ops']} torch ops per warm call " \
                                      f"(expected {ops}: e.g. an allocation per call)"
        assert r["ns"] < BOUND_NS, f"{name}: {r['ns']:.0f} ns per warm call"
