"""Which algorithm each collective uses, by message size, world size and how it is called.

How a call is made changes which algorithm wins. Called eagerly from Python, the host's
launch work is on the critical path of a small message; replayed from a CUDA graph, only
device time counts. So there are two tables per op and world size, "eager" and "graph",
and `select(..., graph=True)` (the calls made while a graph is being captured) reads the
second. A table is a list of rows [largest bytes per rank or None, algorithm], first
match wins; "nccl" hands the call to torch.distributed. Where ranks share a GPU, NCCL
cannot run and a "nccl" row gives way to a trident algorithm of a neighbouring row
(`select(..., nccl=False)`).

Where the tables come from, first found wins (loaded once per process and world size):
  1. `trident tune` on this machine: a file in the user's cache keyed by GPU model, world
     size and NVLink topology (tune_cache.py);
  2. the built-in tables (tables.json beside this file), measured by `trident bench ccl
     --update-selector`. A world size that was not measured uses the rows of the nearest
     measured one, and describe() says so. These are GPU measurements: on the CPU
     emulation the cost-model rows are used instead, so that the selector's choice runs
     trident's kernels there.

Bytes per rank: all_reduce and broadcast the tensor, all_gather the input block,
reduce_scatter the output block, all_to_all the input.
"""
from __future__ import annotations

import hashlib
import json
import os
import re

from ..runtime import _env
from . import registry, tune_cache

TABLES_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tables.json")
MODES = ("eager", "graph")
# Algorithms a caller must ask for by name: never in a table, so "auto" never picks them
# (registry.py declares them with auto=False and says why).
EXPLICIT_ONLY = registry.explicit_only()
# Algorithms that run only where NCCL can ("nccl": registry.py), which nccl=False skips.
NEEDS_NCCL = registry.needs_nccl()


class Tables:
    """The rows in use for one world size, and where they came from (`source`)."""
    __slots__ = ("rows", "source")

    def __init__(self, entry: dict, fallback: dict, source: str):
        self.source = source
        self.rows = {mode: {op: [(lim, name) for lim, name in rows]
                            for op, rows in {**fallback["eager"], **entry.get("eager", {}),
                                             **entry.get(mode, {})}.items()}
                     for mode in MODES}


_active: dict[int, Tables] = {}
_builtin: dict | None = None


def builtin() -> dict:
    global _builtin
    if _builtin is None:
        with open(TABLES_PATH) as f:
            _builtin = json.load(f)
    return _builtin


def tables_for(world_size: int, doc: dict | None = None, origin: str = "") -> Tables:
    """The tables of `doc` (default: this machine's tuned file, else the built-in one)
    for `world_size`: its own rows if measured, else the nearest measured world size's."""
    if doc is None:
        path, doc = tune_cache.find(world_size)
        origin = f"tuned on this machine: {path}" if doc else f"built-in: {TABLES_PATH}"
        doc = doc or builtin()
    cost = builtin()["cost_model"]
    measured = {int(w): e for w, e in doc.get("world_sizes", {}).items() if e.get("measured")}
    if _env.INTERPRET and doc is builtin():
        measured = {}                      # GPU measurements say nothing about the emulation
    if world_size in measured:
        entry, which = measured[world_size], f"world size {world_size} measured"
    elif measured:
        near = min(measured, key=lambda m: (abs(m - world_size), -m))
        entry, which = measured[near], (f"world size {world_size} NOT measured: using world "
                                        f"size {near}'s rows")
    else:
        entry, which = cost, "cost model"
    note = f"; {entry['source']}" if entry.get("source") else ""
    return Tables(entry, cost, f"{origin} ({which}{note})")


def _active_tables(world_size: int) -> Tables:
    """The tables `select` reads for `world_size` in this process (loaded on first use)."""
    active = _active.get(world_size)
    if active is None:
        active = _active[world_size] = tables_for(world_size)
    return active


def fingerprint(world_size: int) -> tuple[int, str]:
    """(digest, source) of the rows `select` uses for `world_size` in this process. The
    tables are read per process (a tuned file on this machine, else the built-in one), but
    every rank must choose alike: ccl.common.Agreed compares the digests across ranks."""
    active = _active_tables(world_size)
    text = json.dumps(active.rows, sort_keys=True).encode()
    digest = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)
    return digest, active.source


def select(op: str, nbytes: int, world_size: int, table: dict | None = None,
           graph: bool = False, nccl: bool = True) -> str:
    """The algorithm for `op` at `nbytes` per rank on `world_size` ranks; graph=True for a
    call being captured into a CUDA graph. `table`: a tables document to use instead of
    the machine's (tests). nccl=False (ranks that share a GPU, where NCCL cannot run)
    never returns "nccl" (see `_row`)."""
    active = tables_for(world_size, table, "given") if table is not None \
        else _active_tables(world_size)
    rows = active.rows["graph" if graph else "eager"][op]
    name = _row(rows, nbytes, nccl)
    if name is None:                       # every row needs NCCL: the cost model's choice
        name = _row(builtin()["cost_model"]["eager"][op], nbytes, False)
    return name


def _row(rows: list, nbytes: int, nccl: bool) -> str | None:
    """The algorithm of the first row that takes `nbytes`. Without nccl, where that row is
    "nccl": the first trident row above it (the algorithm measured best at the next larger
    sizes: where NCCL wins, the bandwidth regime has begun), else the last one below it;
    None if there is no trident row."""
    at = next((i for i, (limit, _) in enumerate(rows) if limit is None or nbytes <= limit),
              len(rows) - 1)
    if nccl or rows[at][1] not in NEEDS_NCCL:
        return rows[at][1]
    for limit, name in rows[at + 1:] + rows[at::-1]:
        if name not in NEEDS_NCCL:
            return name
    return None


def describe(world_size: int) -> str:
    """Which tables a call on `world_size` ranks uses, for `trident info`."""
    return tables_for(world_size).source


def reload() -> None:
    """Forget the loaded tables (after `trident tune` wrote new ones, or in tests)."""
    global _builtin
    _active.clear()
    _builtin = None


def dumps(doc: dict) -> str:
    """A tables document as JSON, one row per line."""
    text = json.dumps(doc, indent=1)
    return re.sub(r"\[\s+(\d+|null),\s+(\"\w+\")\s+\]", r"[\1, \2]", text) + "\n"
