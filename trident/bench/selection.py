"""Selector tables from measurements (`trident bench ccl --update-selector`, `trident tune`).

For each op and measured size, the fastest of trident's algorithms and NCCL -- by eager
time for the "eager" table, by graph time for the "graph" table -- then runs of sizes
with the same winner become one row whose limit is the largest size of the run (sizes
between two measured ones take the next run's winner). torch's symmetric-memory ops and
"trident_auto" are not candidates: the selector cannot hand a call to the first, and the
second is the selector itself; nor are selector.EXPLICIT_ONLY's algorithms.
"""
from __future__ import annotations

import json
import os
import shutil

from ..ccl import selector

COLUMN = {"eager": "eager_us", "graph": "graph_us"}


def _algorithm(impl: str) -> str | None:
    if impl in ("nccl", "gloo"):     # the torch.distributed baseline (gloo on the CPU)
        return "nccl"
    if impl.startswith("trident_") and impl != "trident_auto":
        name = impl[len("trident_"):]
        return None if name in selector.EXPLICIT_ONLY else name
    return None


def winners(rows: list[dict], op: str, column: str) -> list[tuple[int, str]]:
    """[(bytes, fastest algorithm)] over the sizes where `column` was measured."""
    best: dict[int, tuple[float, str]] = {}
    for r in rows:
        name, us = _algorithm(r["impl"]), r.get(column)
        if r["op"] == op and name and us and (r["bytes"] not in best or us < best[r["bytes"]][0]):
            best[r["bytes"]] = (us, name)
    return [(size, best[size][1]) for size in sorted(best)]


def table_rows(wins: list[tuple[int, str]]) -> list[list]:
    """Runs of one winner as [largest bytes, algorithm] rows; the last has no limit."""
    rows: list[list] = []
    for size, name in wins:
        if rows and rows[-1][1] == name:
            rows[-1][0] = size
        else:
            rows.append([size, name])
    if rows:
        rows[-1][0] = None
    return rows


def entry(rows: list[dict], ops, meta: dict, calls: int | None) -> dict:
    """The tables of one world size, with what they were measured on."""
    tables = {mode: {op: t for op in ops if (t := table_rows(winners(rows, op, column)))}
              for mode, column in COLUMN.items()}
    how = (f"eager: {calls or '?'} calls back to back after a device barrier, time / calls; "
           + ("graph: the same calls replayed from one CUDA graph" if tables["graph"] else
              "graph: not measured (no CUDA graphs here), the eager rows serve both"))
    return {"source": f"{meta['device']}, {meta['date']}, torch {meta['torch']}, triton "
                      f"{meta['triton']}; {how}",
            "measured": True, "device": meta["device"], "date": meta["date"],
            "sizes": sorted({r["bytes"] for r in rows}),
            **{mode: t for mode, t in tables.items() if t}}


def merge(path: str, world_size: int, new: dict) -> str:
    """Put `new` in as the tables of `world_size` in the document at `path` (a copy of the
    built-in tables.json when it does not exist yet); returns the path."""
    if not os.path.exists(path):
        shutil.copy(selector.TABLES_PATH, path)
    with open(path) as f:
        doc = json.load(f)
    doc.setdefault("world_sizes", {})[str(world_size)] = new
    with open(path, "w") as f:
        f.write(selector.dumps(doc))
    selector.reload()
    return path


def describe_rows(rows: list[list]) -> str:
    """'<= 1 KiB one_shot, <= 4 MiB two_shot, larger nccl' for a printout."""
    from .common import fmt_bytes
    return ", ".join(f"<= {fmt_bytes(lim)} {name}" if lim is not None else
                     (f"larger {name}" if len(rows) > 1 else f"all {name}") for lim, name in rows)
