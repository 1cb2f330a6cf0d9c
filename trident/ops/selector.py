"""Which path an op takes: trident's fused kernel or the plain one (NCCL + cuBLAS).

The choice comes from measurements, kept in crossover.json beside this file: one entry
per (op, GPU, world size, M, N, K) with the times of both paths, written by `trident
bench ops --update-crossover` (edit by hand freely): fused_us / plain_us eagerly (calls
queued from Python), fused_graph_us / plain_graph_us replayed from a CUDA graph. A call
being captured into a graph compares the graph times (the eager ones where an entry has
none); any other call the eager ones. A call takes the fused path only if the nearest
measured shape of the same op, GPU model and world size -- nearest in log2 of M, N and
K, and at most MAX_DISTANCE away -- measured the fused path faster.
Anything unmeasured takes the plain path, so trident never picks a path measured slower
than the baseline. On the CPU emulation there is nothing to measure: the fused path is
the default there, so that the kernels are what the tests exercise. Where ranks share a
GPU (`ctx.nccl_available` False) the plain path cannot run (NCCL needs a GPU per rank):
"auto" is fused, and asking for "plain" raises a ValueError that says why.

Vocabulary, shared with the collectives (trident/ccl/selector.py): `algorithm=` names
the path, "auto" (the default) asks `select`, and "nccl" is the path through
torch.distributed -- here cuBLAS + the NCCL collective, which this module and the
crossover table call "plain" ("nccl" is accepted as its name).
"""
from __future__ import annotations

import json
import math
import os

from ..ccl import nccl

TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crossover.json")
MAX_DISTANCE = 1.0          # in log2 units per dimension (a factor of 2)
ALGORITHMS = ("auto", "fused", "plain")
ALIASES = {"nccl": "plain"}     # the collectives' name for the torch.distributed path

_table: list[dict] | None = None
_choices: dict = {}          # (op, device, world, M, N, K) -> choice, for the default table


def load_table(path: str = TABLE_PATH) -> list[dict]:
    global _table
    if _table is None or path != TABLE_PATH:
        try:
            with open(path) as f:
                entries = json.load(f).get("entries", [])
        except FileNotFoundError:
            entries = []
        if path != TABLE_PATH:
            return entries
        _table = entries
    return _table


def device_name(ctx) -> str:
    if ctx.backend != "cuda":
        return "cpu"
    import torch
    return torch.cuda.get_device_name(ctx.device)


def _capturing(ctx) -> bool:
    capturing = getattr(ctx, "capturing", None)
    return bool(capturing and capturing())


def _times(entry: dict, graph: bool) -> tuple[float, float]:
    if graph and "fused_graph_us" in entry and "plain_graph_us" in entry:
        return entry["fused_graph_us"], entry["plain_graph_us"]
    return entry["fused_us"], entry["plain_us"]


def select(ctx, op: str, M: int, N: int, K: int | None, table: list[dict] | None = None,
           graph: bool | None = None) -> str:
    """'fused' or 'plain' for this call (see the module docstring); graph: whether the call
    is captured into a CUDA graph (default: whether the current stream is capturing).
    K=None matches on M and N only: row-parallel ops pass it, since their K is each rank's
    own shard and may differ between ranks, which must all choose alike."""
    if ctx.backend != "cuda" or not nccl.available(ctx):   # (ranks sharing a GPU: no NCCL)
        return "fused"
    graph = _capturing(ctx) if graph is None else graph
    name = device_name(ctx)
    key = (op, name, ctx.world_size, M, N, K, graph)
    if table is None and key in _choices:
        return _choices[key]
    best, best_d = None, math.inf
    for e in load_table() if table is None else table:
        if e["op"] != op or e["world_size"] != ctx.world_size or e["device"] not in name:
            continue
        d = max(abs(math.log2(M / e["M"])), abs(math.log2(N / e["N"])),
                0.0 if K is None else abs(math.log2(K / e["K"])))
        if d < best_d:
            best, best_d = e, d
    choice = "plain"
    if best is not None and best_d <= MAX_DISTANCE:
        fused_us, plain_us = _times(best, graph)
        if fused_us < plain_us:
            choice = "fused"
    if table is None:
        _choices[key] = choice
    return choice


choose = select                # the name of earlier versions


def resolve(ctx, op: str, algorithm: str, M: int, N: int, K: int) -> str:
    """The path a call takes: `algorithm` by name ("nccl" = "plain"), or select's choice
    for "auto"."""
    asked = algorithm
    algorithm = ALIASES.get(algorithm, algorithm)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"{op}: algorithm must be one of {ALGORITHMS + tuple(ALIASES)}, "
                         f"got {algorithm!r}")
    if algorithm == "plain":
        nccl.check_available(ctx, f"{op}: algorithm {asked!r} (cuBLAS + NCCL)",
                             [a for a in ALGORITHMS if a != "plain"])
    return select(ctx, op, M, N, K) if algorithm == "auto" else algorithm


def update_table(entries: list[dict], path: str = TABLE_PATH) -> str:
    """Merge measured entries into the table (same op/device/world/shape is replaced)."""
    global _table
    key = lambda e: (e["op"], e["device"], e["world_size"], e["M"], e["N"], e["K"])  # noqa: E731
    merged = {key(e): e for e in (load_table() if path == TABLE_PATH else load_table(path))}
    merged.update({key(e): e for e in entries})
    rows = sorted(merged.values(), key=key)
    with open(path, "w") as f:
        json.dump({"about": "measured by `trident bench ops --update-crossover` (fused_us/plain_us "
                            "eager, *_graph_us from a CUDA graph; entries without graph times "
                            "are from one call after a device barrier); see selector.py",
                   "entries": rows}, f, indent=1)
        f.write("\n")
    _table = None
    _choices.clear()
    return path
