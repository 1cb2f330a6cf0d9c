"""`trident tune --ops`: time every schedule of the three fused ops on this machine, eagerly
and from CUDA graphs, and write the table "auto" reads (trident/ops/auto.py).

For each op, each M bucket (auto.M_BUCKETS: M = 1, 16, 64, 256, 1024, 4096 rows) and each
class of the shared size (auto.SIZE_CLASSES: 4096, 8192, 16384; --quick: 8192 only), it
times each registered schedule that can run here ("plain" and "async_tp" only with a GPU
per rank, schedules.unavailable; "epilogue" up to M = 1024, its small-M role: its one-shot
scratch grows with M * N * world) with bench/common.time_modes: calls queued back to back
(eager) and replayed from a CUDA graph (graph), the max over ranks of the median. The other size (all_gather_matmul's N per
rank, the row-parallel ops' K per rank) is taken equal to the shared one. A cell (op,
world, M bucket, class, mode) keeps every schedule's time, the geometric mean over the
cell's shapes; a schedule that failed on one of them is left out of that cell, so the
times of a cell are always of the same shapes, and "auto" takes the smallest: it can never
pick a schedule measured slower than another of this run. Beside them, the cell's `points`:
each measured shape's own times, which auto takes first for a call of that M and shared
size (auto.py), so that at a measured shape it runs that shape's fastest schedule.

The table goes to the tune cache under this machine's key (auto.tuned_path: GPU model,
world size, topology), or --out. Not yet run on a GPU: expect several minutes per world
size (Triton compiles each kernel variant on its first call; --quick times a third).
On the CPU emulation it runs two tiny shapes eagerly: a check of the round trip only (the
interpreter's times say nothing, and auto ignores tables there).
"""
from __future__ import annotations

import math

import torch

from ..ops import auto, schedules

GPU_M = (1, 16, 64, 256, 1024, 4096)
GPU_S = (4096, 8192, 16384)
QUICK_S = (8192,)
CPU_M, CPU_S = (1, 16), (64,)
EPILOGUE_MAX_M = auto.EPILOGUE_MAX_M


def _inputs(ctx, op: str, M: int, S: int):
    """(a, w, rows of the op) for op at M rows (all ranks' for all_gather_matmul) and shared
    size S, the other size equal to S; random bf16."""
    world, dev = ctx.world_size, ctx.device
    g = torch.Generator().manual_seed(M * 31 + S)
    if op == "all_gather_matmul":
        m_local = max(1, M // world)
        a = torch.randn(m_local, S, generator=g)
        rows = m_local * world
    else:
        rows = max(world, M // world * world) if op == "matmul_reduce_scatter" else M
        a = torch.randn(rows, S, generator=g)
    w = torch.randn(S, S, generator=g) / S ** 0.5
    return a.to(torch.bfloat16).to(dev), w.to(torch.bfloat16).to(dev), rows


def measure(ctx, ops, Ms, Ss, timing: dict, only=None) -> list[dict]:
    """One row per (op, shape, schedule): eager_us and graph_us (None: not measured). Every
    rank must call it alike (the timings are collective). only: these schedules alone."""
    from ..bench import common
    gpu = ctx.backend == "cuda"
    rows = []
    for op in ops:
        names = [n for n in schedules.registered(op)
                 if schedules.unavailable(ctx, op, n) is None and (only is None or n in only)]
        for S in Ss:
            for M in Ms:
                a, w, m = _inputs(ctx, op, M, S)
                for name in names:
                    if name == "epilogue" and m > EPILOGUE_MAX_M:
                        continue
                    fn = getattr(ctx, op)
                    t = common.time_modes_or_skip(
                        ctx, lambda: fn(a, w, schedule=name), graph=gpu, **timing)
                    rows.append(dict(op=op, M=m, N=S, K=S, schedule=name,
                                     eager_us=t.get("eager_us"), graph_us=t.get("graph_us")))
                    if ctx.rank == 0:
                        print(f"  {op:22} M={m:<5} S={S:<6} {name:11} eager "
                              f"{_us(t.get('eager_us'))} graph {_us(t.get('graph_us'))}",
                              flush=True)
                del a, w
                ctx.barrier()
    return rows


# `trident bench ops` rows (impl) that time a schedule: trident_<name>, "plain", and
# "torch_symm_mem" -- torch's async-TP ops alone, the same torch call as schedule
# "async_tp" (async_tp.torch_call), which its trident_async_tp row makes through the op
BENCH_ALIASES = {"plain": "plain", "torch_symm_mem": "async_tp"}


def schedule_of_row(impl: str) -> str | None:
    """The schedule a `trident bench ops` row of implementation `impl` timed, or None (auto's
    own row, other baselines): trident_<name> is <name>; plain and torch_symm_mem as
    BENCH_ALIASES says."""
    if impl.startswith("trident_") and impl != "trident_auto":
        return impl[len("trident_"):]
    return BENCH_ALIASES.get(impl)


def bench_rows(run_rows: list[dict]) -> list[dict]:
    """measure()'s rows from a `trident bench ops` run's rows that passed their check. A
    case with both a trident_async_tp and a torch_symm_mem row keeps the former (the
    schedule as the op runs it: plan, step)."""
    out = {}
    for r in run_rows:
        name = schedule_of_row(r["impl"])
        if name is None or r.get("status") != "ok":
            continue
        key = (r["op"], r["M"], r["N"], r["K"], name)
        if key in out and r["impl"] not in ("trident_" + name, "plain"):
            continue                    # torch's row where the schedule's own is there
        out[key] = dict(op=r["op"], M=r["M"], N=r["N"], K=r["K"], schedule=name,
                        eager_us=r.get("eager_us"), graph_us=r.get("graph_us"))
    return list(out.values())


def _us(v) -> str:
    return "     -" if v is None else f"{v:8.1f}"


def table(rows: list[dict], device: str, world: int) -> list[dict]:
    """The cells of auto's table from measure()'s rows (see the module docstring)."""
    cells: dict = {}
    for r in rows:
        S = auto.shared_size(r["op"], r["N"], r["K"])
        for mode in auto.MODES:
            key = (r["op"], auto.m_bucket(r["M"]), auto.size_class(S), mode)
            cell = cells.setdefault(key, {"shapes": set(), "times": {}})
            cell["shapes"].add((r["M"], r["N"], r["K"]))
            t = r[f"{mode}_us"]
            if t is not None:
                cell["times"].setdefault(r["schedule"], {})[(r["M"], r["N"], r["K"])] = t
    entries = []
    for (op, bucket, cls, mode), cell in sorted(cells.items()):
        times = {s: math.exp(sum(math.log(v) for v in by.values()) / len(by))
                 for s, by in cell["times"].items() if set(by) == cell["shapes"]}
        if not times:
            continue
        best = min(times, key=lambda s: (times[s], s))
        points = [dict(M=M, N=N, K=K, times_us={s: round(by[(M, N, K)], 3) for s, by in
                                                sorted(cell["times"].items()) if (M, N, K) in by})
                  for M, N, K in sorted(cell["shapes"])]
        entries.append(dict(op=op, device=device, world_size=world, m_bucket=bucket,
                            **{"class": cls}, mode=mode,
                            times_us={s: round(v, 3) for s, v in sorted(times.items())},
                            best=best, shapes=sorted(cell["shapes"]),
                            points=[p for p in points if p["times_us"]]))
    return entries


def tune_rank(ctx, quick: bool, timing: dict, out: str | None, ops=schedules.OPS,
              shapes: tuple | None = None, only=None):
    """One rank's part of `trident tune --ops`: measure, then rank 0 writes the table.
    Returns (path, entries) on rank 0, None elsewhere. shapes: (Ms, Ss) instead of the
    defaults, only: the schedules to time (tests)."""
    import json
    import os
    from ..ccl import tune_cache
    from ..ops import selector
    gpu = ctx.backend == "cuda"
    Ms, Ss = shapes or ((GPU_M, QUICK_S if quick else GPU_S) if gpu else (CPU_M, CPU_S))
    rows = measure(ctx, ops, Ms, Ss, timing, only)
    if ctx.rank != 0:
        return None
    entries = table(rows, selector.device_name(ctx), ctx.world_size)
    key = tune_cache.machine_key(ctx.world_size)
    path = out or auto.tuned_path(ctx.world_size, key)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    # a file that holds other GPUs' or world sizes' cells keeps them (e.g. --out
    # trident/ops/schedule_table.json, the built-in table, tuned once per world size)
    others = [e for e in auto._read(path) if (e.get("device"), e.get("world_size"))
              != (selector.device_name(ctx), ctx.world_size)]
    with open(path, "w") as f:
        json.dump({"about": "measured by `trident tune --ops`; see trident/ops/auto.py",
                   "key": key, "rows": rows, "entries": others + entries}, f, indent=1)
        f.write("\n")
    auto.forget()
    return path, entries
