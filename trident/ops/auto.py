"""`schedule="auto"`: which schedule (schedules.py) a fused-op call runs.

The choice is per op, world size, M bucket (1, 2-16, 17-64, 65-256, 257-1024, >1024), class
of the size every rank shares (K of all_gather_matmul, N of the row-parallel ops: the
other one is each rank's own shard and may differ), and mode (eager, or captured into a
CUDA graph). It comes from the first of:
1. this machine's tuned table (`trident tune --ops`: every schedule timed on this machine,
   eager and graph, in one run; a file in the tune cache under the machine's key,
   ccl/tune_cache.py);
2. the built-in table, schedule_table.json beside this file (the same format: cells the
   project measured on its GPUs);
3. crossover.json (selector.py: fused against NCCL + cuBLAS, measured by `trident bench
   ops --update-crossover`), at the nearest measured shape within a factor of 2 in M and
   the shared size;
4. the cost model (`estimate`: floors of HBM, NVLink and tensor cores plus fixed latencies;
   not measured, a guess that ranks the schedules where nothing is known).
A cell names the times of every schedule it measured; auto takes the fastest of those that
can run here, so it never picks a schedule measured slower than another of the same run.
A cell with none that can run here falls through to the next source. At a shape the cell
measured (its `points`: the same M and shared size), the fastest at that shape is taken
instead; where two measured shapes differ only in the size each rank holds on its own
(e.g. Llama-3-8B's attention-out and MLP-down, N = 4096 both) and their fastest differ,
the ranks compare their own sizes in one host exchange (`_SameEverywhere`, the first time
a call of those sizes chooses) and take that shape's fastest only if all hold the same.

Every rank must take the same schedule: the inputs are sizes all ranks share, the mode
(ranks capture the same calls), the GPU model and the tables read -- compared across ranks
once per context (`_agreed`: one host exchange at the first "auto" call, which every rank
makes) -- and whether NCCL runs on every rank (ccl.common.Agreed). On the CPU emulation
only the cost model is used (the interpreter's times mean nothing), without "plain", so
that the tests run trident's own kernels: deterministic, the same on every rank.
"""
from __future__ import annotations

import hashlib
import json
import math
import os

from . import schedules, selector

TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schedule_table.json")
M_BUCKETS = ((1, "1"), (16, "2-16"), (64, "17-64"), (256, "65-256"), (1024, "257-1024"),
             (math.inf, ">1024"))
SIZE_CLASSES = ((4096, "<=4096"), (8192, "<=8192"), (math.inf, ">8192"))
MODES = ("eager", "graph")
EPILOGUE_MAX_M = 1024      # `trident tune --ops` times "epilogue" up to this many rows

# Hopper-class floors for the cost model: usable HBM and NVLink (one way per GPU) bytes/s,
# dense bf16 flop/s, and the fixed latencies it adds (us). Starting points, not measured.
HW = dict(hbm=3.0e12, link=3.7e11, flops=6.0e14, launch_us=2.5, sync_us=5.0, host_us=4.0,
          nccl_us=12.0, nccl_eager_us=22.0)


def m_bucket(M: int) -> str:
    return next(name for top, name in M_BUCKETS if M <= top)


def size_class(S: int) -> str:
    return next(name for top, name in SIZE_CLASSES if S <= top)


def shared_size(op: str, N: int, K: int) -> int:
    """The size besides M that every rank's call has alike."""
    return K if op == "all_gather_matmul" else N


# ---------------------------------------------------------------------------- tables
def _read(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return json.load(f).get("entries", [])
    except (OSError, ValueError):
        return []


_builtin: list | None = None


def builtin() -> list[dict]:
    global _builtin
    if _builtin is None:
        _builtin = _read(TABLE_PATH)
    return _builtin


def builtin_about() -> str:
    """What the built-in table says it was built from (its "about")."""
    try:
        with open(TABLE_PATH) as f:
            return json.load(f).get("about", "")
    except (OSError, ValueError):
        return "(no built-in table)"


def tuned_path(world_size: int, key: dict | None = None) -> str:
    """Where `trident tune --ops` keeps this machine's table for `world_size` ranks."""
    from ..ccl import tune_cache
    key = key or tune_cache.machine_key(world_size)
    return os.path.join(os.path.dirname(tune_cache.cache_path(key)),
                        "ops-" + os.path.basename(tune_cache.cache_path(key)))


_tuned: dict = {}


def tuned(world_size: int) -> tuple[str | None, list[dict]]:
    """(path, entries) of this machine's tuned table, or (None, []). The machine key (the
    topology hash) is computed only if a file for this GPU model and world size exists."""
    if world_size in _tuned:
        return _tuned[world_size]
    from ..ccl import tune_cache
    found: tuple = (None, [])
    prefix = f"ops-{tune_cache.slug(tune_cache.gpu_name())}-w{world_size}-"
    try:
        present = any(f.startswith(prefix) for f in os.listdir(tune_cache.tune_dir()))
    except OSError:
        present = False
    if present:
        path = tuned_path(world_size)
        try:
            with open(path) as f:
                doc = json.load(f)
            if doc.get("key") == tune_cache.machine_key(world_size):
                found = (path, doc.get("entries", []))
        except (OSError, ValueError):
            pass
    _tuned[world_size] = found
    return found


def forget() -> None:
    """Drop what was read (after `trident tune --ops` wrote a table, and in tests)."""
    global _builtin
    _builtin = None
    _tuned.clear()
    _choices.clear()
    selector._table = None


def digest(world_size: int) -> tuple[int, str]:
    """(digest, source) of the tables this process selects from for `world_size` ranks:
    what `_agreed` compares across ranks."""
    path, entries = tuned(world_size)
    text = json.dumps([entries, builtin(), selector.load_table()], sort_keys=True).encode()
    value = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)
    return value, path or "built-in tables"


class _Agreed:
    """The ranks' tables and GPU model, compared once per context (a workspace: made at the
    same call on every rank, then one host exchange)."""

    def __init__(self, ctx):
        value, self.source = digest(ctx.world_size)
        self.mine = [value, _device_digest(ctx)]
        self.pending, self.error = True, None

    def exchange(self, ctx) -> None:
        self.pending = False
        rows, sources = ctx.host_exchange("ops.auto.agree", self.mine, detail=self.source)
        if len({tuple(int(v) for v in row[:2]) for row in rows}) > 1:
            names = sources or [self.source] * len(rows)
            self.error = ("schedule 'auto' needs the same GPU model and schedule tables on "
                          "every rank, but they differ (" + "; ".join(
                              f"rank {r}: {names[r]}" for r in range(len(rows))) +
                          "); give every rank the same TRIDENT_CACHE_DIR (or rerun `trident "
                          "tune --ops`), or pass schedule= by name")


def _device_digest(ctx) -> int:
    name = selector.device_name(ctx).encode()
    return int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "little", signed=True)


def _agreed(ctx, op: str) -> None:
    facts = ctx.workspace("ops.auto.agreed", _Agreed)
    if facts.pending:
        facts.exchange(ctx)
    if facts.error is not None:
        raise ValueError(f"{op}: {facts.error}")


def _fastest(times: dict, allowed) -> str | None:
    times = {s: t for s, t in times.items() if s in allowed and t is not None}
    return min(times, key=lambda s: (times[s], s)) if times else None


def _from_cell(entries, op, device, world, bucket, cls, mode, allowed,
               M=None, S=None, own=None, same_everywhere=None) -> str | None:
    """The schedule of the first cell that matches (this mode's, else the eager one): its
    measured point at M rows and shared size S where it has one (`_from_points`), else the
    fastest of the cell's times (geometric means over its shapes) that can run here."""
    for mode_ in (mode, "eager"):
        for e in entries:
            if (e.get("op") == op and e.get("world_size") == world
                    and e.get("m_bucket") == bucket and e.get("class") == cls
                    and e.get("mode") == mode_ and e.get("device", "") in device):
                name = _from_points(e.get("points", ()), op, M, S, own, allowed,
                                    same_everywhere) or _fastest(e.get("times_us", {}), allowed)
                if name:
                    return name
        if mode == "eager":
            break
    return None


def _from_points(points, op, M, S, own, allowed, same_everywhere) -> str | None:
    """The fastest schedule that can run here at the cell's measured shape(s) of M rows and
    shared size S. Shapes that differ only in the size each rank has on its own (`own`: N
    of all_gather_matmul, K of the row-parallel ops) and whose fastest differ are told
    apart by `own` only if every rank's is the same (same_everywhere(): one host exchange,
    made by every rank alike, since M, S and the tables are the same everywhere); else
    None (the cell's time)."""
    picks = {}
    for p in points:
        if p["M"] == M and shared_size(op, p["N"], p["K"]) == S:
            name = _fastest(p.get("times_us", {}), allowed)
            if name:
                picks[p["N"] if op == "all_gather_matmul" else p["K"]] = name
    if len(set(picks.values())) == 1:
        return next(iter(picks.values()))
    if not picks or own not in picks or same_everywhere is None or not same_everywhere():
        return None
    return picks[own]


def _from_crossover(op, device, world, M, S, graph, allowed) -> str | None:
    best = selector.nearest(op, device, world, M, S)
    if best is None:
        return None
    fused_us, plain_us = selector.times(best, graph)
    times = {s: t for s, t in (("fused", fused_us), ("plain", plain_us)) if s in allowed}
    return min(times, key=lambda s: (times[s], s)) if times else None


# ---------------------------------------------------------------------------- cost model
def _gemm_us(M, N, K, hw) -> float:
    return 1e6 * max(2.0 * M * N * K / hw["flops"], 2.0 * (M * K + N * K + M * N) / hw["hbm"]) \
        + hw["launch_us"]


def _comm(op, M, N, K, world) -> tuple[float, float]:
    """(bytes each rank's link carries, bytes of the exchanged tensor) at 2-byte elements."""
    if op == "all_gather_matmul":
        full = 2.0 * M * K
        return full * (world - 1) / world, full
    full = 2.0 * M * N
    if op == "matmul_reduce_scatter":
        return full * (world - 1) / world, full
    return full * (world - 1), full                 # one-shot all-reduce


def estimate(name: str, op: str, M: int, S: int, world: int, graph: bool,
             hw: dict = HW) -> float | None:
    """The cost model's time (us) of schedule `name` at M rows and shared size S (the other
    size taken equal to S: ranks may differ in it). Not measured: a ranking of floors."""
    N = K = S
    gemm = _gemm_us(M, N, K, hw)
    link_bytes, full = _comm(op, M, N, K, world)
    wire = 1e6 * link_bytes / hw["link"]
    host = 0.0 if graph else hw["host_us"]
    if name == "sequential":
        copy = 0.0 if op == "all_gather_matmul" else hw["launch_us"] + 2e6 * full / hw["hbm"] / world
        gpu = gemm + hw["sync_us"] + wire + copy
        return max(gpu, host * 3) + host
    if name == "epilogue":
        # measured (docs/fused-ops.md): >= 1.1x "sequential" in few decode cases from
        # graphs, the 1.1x it exists for; so no guess picks it: only a table that timed
        # it fastest
        return None
    if name == "fused":
        return 1.1 * max(gemm, wire) + 3 * hw["sync_us"] + host
    if name == "plain":
        nccl = hw["nccl_us"] if graph else hw["nccl_eager_us"]
        return gemm + nccl + wire * 1.25 + host
    return None


_choices: dict = {}


def choose(ctx, op: str, M: int, N: int, K: int, graph: bool | None = None) -> str:
    """The schedule "auto" runs for a call of `op` with M rows (all ranks' for
    all_gather_matmul), N columns of out and K (see the module docstring; only the shared
    one of N and K is used). graph: whether the call is captured (default: whether the
    stream is capturing now)."""
    if graph is None:
        graph = bool(ctx.capturing())
    world = ctx.world_size
    S = shared_size(op, N, K)
    cpu = ctx.backend != "cuda"
    nccl = (not cpu) and _nccl_everywhere(ctx)
    own = N if op == "all_gather_matmul" else K       # this rank's own size
    key = (op, world, M, S, own, graph, nccl)
    name = _choices.get(key)
    if name is not None:
        return name
    allowed = {n for n, s in schedules.registered(op).items()
               if s.auto and schedules.unavailable(ctx, op, n, nccl) is None}
    name = None
    if not cpu:
        device = selector.device_name(ctx)
        bucket, cls, mode = m_bucket(M), size_class(S), MODES[graph]
        agree = _SameEverywhere(ctx, op, own)
        for entries in (tuned(world)[1], builtin()):
            name = name or _from_cell(entries, op, device, world, bucket, cls, mode, allowed,
                                      M, S, own, agree)
        name = name or _from_crossover(op, device, world, M, S, graph, allowed)
    if name is None:
        costs = {}
        for n in sorted(allowed):
            s = schedules.get(n)
            t = s.cost(op, M, S, world, graph, HW) if s.cost else estimate(n, op, M, S, world, graph)
            if t is not None:
                costs[n] = t
        name = min(costs, key=lambda n: (costs[n], n)) if costs else "sequential"
    _choices[key] = name
    return name


class _SameEverywhere:
    """Whether every rank's own size (N of all_gather_matmul, K of the row-parallel ops) is
    this one: one host exchange, at most once per choose() (asked only where a table's
    measured shapes of the call's shared sizes differ in it and in their fastest)."""

    def __init__(self, ctx, op: str, own: int):
        self.ctx, self.op, self.own, self.answer = ctx, op, own, None

    def __call__(self) -> bool:
        if self.answer is None:
            rows, _ = self.ctx.host_exchange(f"{self.op}.auto.own", [self.own])
            self.answer = all(int(r[0]) == self.own for r in rows)
        return self.answer


def _nccl_everywhere(ctx) -> bool:
    from ..ccl import common, nccl
    return common.agreed(ctx).nccl and nccl.available(ctx)


def resolve(ctx, op: str, name: str, M: int, N: int, K: int) -> str:
    """The schedule of a call that asked for `name` (schedules.normalize'd): `name`, or
    choose()'s for "auto" (checking, at a context's first "auto" call, that the ranks read
    the same tables). A named schedule that cannot run here ("plain" or "async_tp" where
    NCCL cannot run, "async_tp" on the CPU emulation or without torch's symmetric-memory
    ops) raises ValueError saying why and naming the schedules that can."""
    if name == "auto":
        if ctx.backend == "cuda":
            _agreed(ctx, op)
        return choose(ctx, op, M, N, K)
    why = schedules.unavailable(ctx, op, name)
    if why is not None:
        can = ["auto"] + [n for n in schedules.registered(op)
                          if schedules.unavailable(ctx, op, n) is None]
        can += [a for a, n in schedules.ALIASES.items() if n in can]
        what = schedules.get(name).about or name
        raise ValueError(f"{op}: schedule {name!r} ({what}): {why}; choose one of {can}")
    return name
