"""The exporter on synthetic events (no ranks needed): format, nesting, lanes, alignment."""
import numpy as np

from trident.trace.chrome import assign_lanes, to_chrome
from trident.trace.summary import summarize
from trident.trace.tags import NAMES

from .chrome_format import check_nesting, check_trace_format


def _nested_events(rng, rank, programs, depth=3, t0=10**12):
    """Random properly nested phases per program: each level splits its parent."""
    rows = []
    for p in range(programs):
        def split(s, e, level):
            rows.append((s, e, int(rng.integers(1, 12)), (rank << 32) | p))
            if level < depth:
                cuts = np.sort(rng.integers(s, e + 1, size=4))
                for a, b in ((cuts[0], cuts[1]), (cuts[2], cuts[3])):
                    split(int(a), int(b), level + 1)
        start = t0 + int(rng.integers(0, 10**6))
        split(start, start + int(rng.integers(1, 10**6)), 0)
    return np.array(rows, dtype=np.int64)


def test_nested_input_stays_on_one_thread_per_program():
    rng = np.random.default_rng(0)
    events = [_nested_events(rng, r, programs=5) for r in range(3)]
    doc = to_chrome(events, dropped=[0, 0, 0])
    xs = check_trace_format(doc)
    check_nesting(xs)
    assert len(xs) == sum(len(e) for e in events)
    for r, ev in enumerate(events):
        tids = {x["tid"] for x in xs if x["pid"] == r}
        assert tids == set(int(p) for p in ev[:, 3] & 0xFFFFFFFF)
    # aligned to the earliest event of any rank
    assert min(x["ts"] for x in xs) < 0.001
    earliest = min(int(e[:, 0].min()) for e in events)
    for x in xs[:20]:
        ev = events[x["pid"]]
        row = ev[(ev[:, 3] & 0xFFFFFFFF) == x["args"]["program"]]
        assert (row[:, 0] - earliest == round(x["ts"] * 1000 - 0.25)).any()


def test_partial_overlaps_go_to_extra_threads():
    rng = np.random.default_rng(1)
    starts = rng.integers(0, 1000, size=300)
    ends = starts + rng.integers(0, 300, size=300)
    lanes = assign_lanes(starts, ends)
    for k in np.unique(lanes):                   # brute force: every pair in a lane nests
        s, e = starts[lanes == k], ends[lanes == k]
        for i in range(len(s)):
            disjoint = (e <= s[i]) | (s >= e[i])
            inside = (s >= s[i]) & (e <= e[i])
            outside = (s <= s[i]) & (e >= e[i])
            assert (disjoint | inside | outside).all()
    events = [np.stack([starts, ends, np.full(300, 3), np.zeros(300, np.int64)], 1)]
    xs = check_trace_format(to_chrome(events))
    check_nesting(xs)
    names = {ev["tid"]: ev["args"]["name"] for ev in to_chrome(events)["traceEvents"]
             if ev["name"] == "thread_name"}
    assert names[0] == "program 0" and all("overlap" in n for t, n in names.items() if t)


def test_summary_matches_numpy_on_random_events():
    rng = np.random.default_rng(2)
    events = [_nested_events(rng, r, programs=4) for r in range(2)]
    rows = summarize(events)
    for row in rows:
        ev = events[row["rank"]]
        tag = {v: k for k, v in NAMES.items()}[row["tag"]]
        d = (ev[ev[:, 2] == tag, 1] - ev[ev[:, 2] == tag, 0]) / 1e3
        assert row["count"] == len(d)
        assert np.isclose(row["median_us"], sorted(d)[len(d) // 2] if len(d) % 2 else
                          (sorted(d)[len(d) // 2 - 1] + sorted(d)[len(d) // 2]) / 2)
        assert np.isclose(row["min_us"], d.min()) and np.isclose(row["max_us"], d.max())
    assert sum(r["count"] for r in rows) == sum(len(e) for e in events)


def test_empty_ranks_still_named():
    doc = to_chrome([np.zeros((0, 4), np.int64), np.zeros((0, 4), np.int64)], dropped=[3, 0])
    check_trace_format(doc)
    assert {e["pid"] for e in doc["traceEvents"] if e["name"] == "process_name"} == {0, 1}
    assert doc["otherData"]["dropped_events"] == {"0": 3, "1": 0}
