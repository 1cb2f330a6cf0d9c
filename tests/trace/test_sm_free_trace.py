"""bench/sm_free_trace.py (the SM-free receive, shown) on 2 ranks at tiny size: the split
mode's results are right, every rank's trace holds the send halves, the receive halves and
the GEMM spans measured by the marker kernels, and no trident event falls inside its rank's
GEMM span; the check finds an overlap when there is one; --render draws the PNG from the
JSON alone."""
import importlib.util
import json
import os
import sys

import pytest

from ..conftest import get_pool

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "sm_free_trace.py")


def _module():
    mod = sys.modules.get("sm_free_trace")
    if mod is None:
        spec = importlib.util.spec_from_file_location("sm_free_trace", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["sm_free_trace"] = mod          # dataclasses look their module up
        spec.loader.exec_module(mod)
    return mod


def _record(ctx):
    mod = _module()
    return mod.record(ctx, mod.TINY)


@pytest.fixture(scope="module")
def trace():
    return get_pool(2).run(_record)[0]


def test_split_mode_trace_has_no_trident_event_in_the_gemm(trace):
    mod = _module()
    meta = trace["otherData"]["sm_free"]
    check = meta["check"]
    assert check["ok"], check
    assert check == mod.analyze(json.loads(json.dumps(trace)))      # what --render sees
    spans = mod.spans(trace)
    assert sorted(spans) == [0, 1]
    for rank, sp in spans.items():
        names = {n for _, _, n in sp["trident"]}
        assert {"dispatch", "combine", "wait", "recv"} <= names, (rank, names)
        assert len(sp["gemm"]) == 2 * mod.TINY.iters, (rank, sp["gemm"])
        r = check["ranks"][str(rank)]
        assert r["trident_events_in_gemm"] == 0
        # each GEMM sits between a send half before it and a receive half after it
        assert all(g is not None and g >= 0 for g in r["gap_before_gemm_us"]), r
        assert all(g is not None and g >= 0 for g in r["gap_after_gemm_us"]), r
        for g0, g1 in sp["gemm"]:
            assert any(n in ("dispatch", "combine") and e1 <= g0 for _, e1, n in sp["trident"])
            assert any(n == "recv" and e0 >= g1 for e0, _, n in sp["trident"])
    gemm_threads = {(e["pid"], e["tid"]) for e in trace["traceEvents"]
                    if e.get("ph") == "X" and e["name"] == "GEMM"}
    assert gemm_threads == {(0, mod.GEMM_TID), (1, mod.GEMM_TID)}


def test_check_finds_an_overlap():
    mod = _module()

    def x(name, ts, dur, cat="trident"):
        return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": 0, "tid": 0}

    clean = {"traceEvents": [x("dispatch", 0, 5), x("GEMM", 10, 10, "gemm"), x("recv", 21, 2)]}
    assert mod.analyze(clean)["ok"]
    busy = {"traceEvents": clean["traceEvents"] + [x("wait", 15, 1)]}
    check = mod.analyze(busy)
    assert not check["ok"] and check["ranks"]["0"]["trident_events_in_gemm"] == 1
    assert check["ranks"]["0"]["overlaps"] == [("wait", 1.0)]
    no_gemm = {"traceEvents": [x("dispatch", 0, 5)]}
    assert not mod.analyze(no_gemm)["ok"]


def test_render_from_the_json(trace, tmp_path):
    pytest.importorskip("matplotlib")
    mod = _module()
    path, png = tmp_path / "t.json", tmp_path / "out" / "t.png"
    path.write_text(json.dumps(trace))
    assert mod.main(["--render", str(path), str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    path.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ValueError, match="no GEMM spans"):
        mod.main(["--render", str(path), str(png)])
