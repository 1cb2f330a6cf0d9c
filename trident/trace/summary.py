"""The short table printed after a trace: time per tag, per rank.

One row per (tag, rank) with the number of events and the min / median / max / total
duration in microseconds, so that a slow phase or a straggling rank stands out without
opening the timeline. Durations are those of the events themselves (end - start).
"""
from __future__ import annotations

import numpy as np

from .tags import name as tag_name

COLUMNS = ["tag", "rank", "count", "min_us", "median_us", "max_us", "total_us"]


def summarize(events_by_rank: list[np.ndarray]) -> list[dict]:
    """Rows sorted by tag name, then rank."""
    rows = []
    for rank, ev in enumerate(events_by_rank):
        if not len(ev):
            continue
        for tag in np.unique(ev[:, 2]):
            dur_us = (ev[ev[:, 2] == tag, 1] - ev[ev[:, 2] == tag, 0]) / 1000.0
            rows.append({"tag": tag_name(tag), "rank": rank, "count": int(len(dur_us)),
                         "min_us": float(dur_us.min()), "median_us": float(np.median(dur_us)),
                         "max_us": float(dur_us.max()), "total_us": float(dur_us.sum())})
    return sorted(rows, key=lambda r: (r["tag"], r["rank"]))


def format_table(rows: list[dict], dropped: list[int] | None = None) -> str:
    def cell(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)
    cells = [[cell(r[c]) for c in COLUMNS] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(COLUMNS, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    if not rows:
        lines.append("(no events recorded: did the ops inside the session read "
                     "trident.trace.kernel_args(ctx)?)")
    if dropped is not None and any(dropped):
        lines.append(f"dropped events (buffer full) per rank: {list(dropped)} -- "
                     f"raise capacity= in ctx.trace(...)")
    return "\n".join(lines)
