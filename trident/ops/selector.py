"""crossover.json: the measured times of trident's fused path against the plain one
(NCCL + cuBLAS), the third source of `schedule="auto"` (auto.py).

One entry per (op, GPU, world size, M, N, K) with the times of both paths, written by
`trident bench ops --update-crossover` (edit by hand freely): fused_us / plain_us eagerly
(calls queued from Python), fused_graph_us / plain_graph_us replayed from a CUDA graph.
`nearest` finds the entry auto reads for a call: the same op, GPU model and world size,
nearest in log2 of M and of the size every rank shares (K of all_gather_matmul, N of the
row-parallel ops), at most MAX_DISTANCE away; `times` gives its two times for the call's
mode (a call captured into a graph compares the graph times, the eager ones where an
entry has none). What chooses a schedule is auto.py alone.
"""
from __future__ import annotations

import json
import math
import os

TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crossover.json")
MAX_DISTANCE = 1.0          # in log2 units per dimension (a factor of 2)

_table: list[dict] | None = None


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


def times(entry: dict, graph: bool) -> tuple[float, float]:
    """(fused_us, plain_us) of `entry` for a call captured into a graph (`graph`) or not."""
    if graph and "fused_graph_us" in entry and "plain_graph_us" in entry:
        return entry["fused_graph_us"], entry["plain_graph_us"]
    return entry["fused_us"], entry["plain_us"]


def nearest(op: str, device: str, world: int, M: int, S: int,
            table: list[dict] | None = None) -> dict | None:
    """The entry of `op` on this GPU model (`device`: its name contains the entry's) and
    world size nearest to M rows and shared size S (the largest log2 distance of the two),
    or None where none is within MAX_DISTANCE. table: the entries (default crossover.json)."""
    best, best_d = None, math.inf
    dim = "K" if op == "all_gather_matmul" else "N"
    for e in load_table() if table is None else table:
        if e["op"] != op or e["world_size"] != world or e["device"] not in device:
            continue
        d = max(abs(math.log2(M / e["M"])), abs(math.log2(S / e[dim])))
        if d < best_d:
            best, best_d = e, d
    return best if best_d <= MAX_DISTANCE else None


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
    return path
