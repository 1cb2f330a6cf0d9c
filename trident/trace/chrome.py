"""Turn the raw per-rank event arrays into one Chrome trace-event JSON object.

The format is the Trace Event Format that chrome://tracing and ui.perfetto.dev both open:
{"traceEvents": [...]} with one complete event ("ph": "X", ts and dur in microseconds)
per recorded phase, rank = process (pid), program = thread (tid), plus "M" metadata
events that name them ("rank 2", "program 17") and keep the ranks in order.

Times are shifted so that the earliest event of any rank is at 0. Perfetto turns the
microsecond numbers back into integer nanoseconds; we emit (ns + 0.25) / 1000 so that
conversion recovers the exact nanosecond whether it rounds or truncates, and a phase
that ends exactly when its parent ends still nests instead of sticking out by 1 ns.

A thread must hold properly nested slices. A kernel's program records nested or
disjoint phases, but two kernels running at once (two streams, or two grids that share
program ids) can make events of one program id overlap partly; such events go to an
extra thread "program P (overlap k)" instead of corrupting the nesting of the first.
"""
from __future__ import annotations

import numpy as np

from .tags import name as tag_name

PROGRAM_MASK = (1 << 32) - 1


def _us(ns: int) -> float:
    return (ns + 0.25) / 1000.0


def assign_lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Lane index per event such that the events of each lane nest properly.

    Greedy over events sorted by (start, longer first): an event joins the first lane
    whose innermost open event contains it, or where nothing is open any more.
    """
    order = np.lexsort((-(ends - starts), starts))
    lanes = np.zeros(len(starts), dtype=np.int64)
    stacks: list[list[int]] = []             # per lane: ends of the open events
    for i in order:
        s, e = int(starts[i]), int(ends[i])
        for k, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or stack[-1] >= e:
                stack.append(e)
                lanes[i] = k
                break
        else:
            stacks.append([e])
            lanes[i] = len(stacks) - 1
    return lanes


def to_chrome(events_by_rank: list[np.ndarray], dropped: list[int] | None = None,
              metadata: dict | None = None) -> dict:
    """events_by_rank[r]: int64 array [n, 4] of (start_ns, end_ns, tag, rank<<32 | program).

    Returns the trace as a dict ready for json.dump.
    """
    nonempty = [ev for ev in events_by_rank if len(ev)]
    t0 = min(int(ev[:, 0].min()) for ev in nonempty) if nonempty else 0
    out: list[dict] = []
    for rank, ev in enumerate(events_by_rank):
        out.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                    "args": {"name": f"rank {rank}"}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                    "args": {"sort_index": rank}})
        if not len(ev):
            continue
        programs = ev[:, 3] & PROGRAM_MASK
        tids = programs.copy()
        next_tid = int(programs.max()) + 1
        names = {int(p): f"program {int(p)}" for p in np.unique(programs)}
        for p in np.unique(programs):
            sel = np.nonzero(programs == p)[0]
            lanes = assign_lanes(ev[sel, 0], ev[sel, 1])
            for k in range(1, int(lanes.max()) + 1):
                tids[sel[lanes == k]] = next_tid
                names[next_tid] = f"program {int(p)} (overlap {k})"
                next_tid += 1
        for tid, label in sorted(names.items()):
            out.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                        "args": {"name": label}})
            out.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid,
                        "args": {"sort_index": tid}})
        for (start, end, tag, _), tid, program in zip(ev.tolist(), tids.tolist(),
                                                       programs.tolist()):
            out.append({"name": tag_name(tag), "cat": "trident", "ph": "X",
                        "ts": _us(start - t0), "dur": _us(end - start),
                        "pid": rank, "tid": tid, "args": {"program": program}})
    other = {"clock": "ns since the earliest event", "t0_ns": t0}
    if dropped is not None:
        other["dropped_events"] = {str(r): int(d) for r, d in enumerate(dropped)}
    other.update(metadata or {})
    return {"traceEvents": out, "displayTimeUnit": "ns", "otherData": other}
