"""An independent checker of the Chrome Trace Event Format (the subset Perfetto reads),
written from the format's specification rather than from trident/trace/chrome.py."""
import math

PHASES = set("BEXiIbneCMsftPOND") | {"(", ")"}


def check_trace_format(doc) -> list[dict]:
    """Raise AssertionError on anything that is not valid; return the "X" events."""
    assert isinstance(doc, dict), "JSON object format: a dict with traceEvents"
    assert isinstance(doc.get("traceEvents"), list)
    if "displayTimeUnit" in doc:
        assert doc["displayTimeUnit"] in ("ms", "ns")
    complete = []
    for ev in doc["traceEvents"]:
        assert isinstance(ev, dict), ev
        assert ev.get("ph") in PHASES, ev
        assert isinstance(ev.get("name"), str) and ev["name"], ev
        for key in ("pid", "tid"):
            assert isinstance(ev.get(key), int) and not isinstance(ev[key], bool), ev
        if "args" in ev:
            assert isinstance(ev["args"], dict), ev
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "thread_name", "process_sort_index",
                                  "thread_sort_index", "process_labels"), ev
            key = "name" if ev["name"].endswith("_name") else "sort_index"
            assert key in ev["args"], ev
            continue
        assert isinstance(ev.get("ts"), (int, float)) and math.isfinite(ev["ts"]), ev
        assert ev["ts"] >= 0, ev
        if ev["ph"] == "X":
            assert isinstance(ev.get("dur"), (int, float)) and ev["dur"] >= 0, ev
            complete.append(ev)
    return complete


def to_ns(us: float, mode: str) -> int:
    """How a reader may turn microseconds into integer nanoseconds."""
    return int(us * 1000) if mode == "truncate" else round(us * 1000)


def check_nesting(events: list[dict]) -> None:
    """In each (pid, tid) every two slices are disjoint or one contains the other,
    whether the reader rounds or truncates to nanoseconds."""
    for mode in ("truncate", "round"):
        by_thread: dict = {}
        for ev in events:
            s = to_ns(ev["ts"], mode)
            by_thread.setdefault((ev["pid"], ev["tid"]), []).append((s, s + to_ns(ev["dur"], mode)))
        for key, spans in by_thread.items():
            spans.sort(key=lambda se: (se[0], -(se[1] - se[0])))
            stack = []
            for s, e in spans:
                while stack and stack[-1] <= s:
                    stack.pop()
                assert not stack or e <= stack[-1], \
                    f"partial overlap in {key} ({mode}): [{s}, {e}] sticks out of a slice ending {stack[-1]}"
                stack.append(e)
