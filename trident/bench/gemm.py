"""`python -m trident.bench.gemm`: trident's GEMM core (trident/ops/gemm.py) against
torch.matmul (cuBLAS) on one GPU, for every config candidate of each shape class
(trident/ops/gemm_configs.py), and the tuned table from the same run.

Shapes: the GEMM each rank runs in `trident bench ops` at tensor parallelism --world
(default 2): the column-parallel layers (all_gather_matmul: M x N/world x K) and the
row-parallel ones (matmul_reduce_scatter / all_reduce: M x N x K/world) of
trident/bench/ops.py (--layers: the models whose name holds one of these words), total M
in --m (default 1,8,16,32,64,128,256,1024,4096,8192: decode at batch 1-64 and one M
bucket of the tables each), plus a few large squares. bf16, random data, out = a @ w.T
with w in nn.Linear layout [N, K].

For each shape: cuBLAS, then the candidates that fit its M (swap-AB ones at M <= 256,
128- or 256-row tiles without swap-AB at M >= BM: docs/history.md, "Notes moved out of the
source"; the table search compares only candidates timed on every shape of a class), then
the table's config with in-kernel descriptors ("table:kdesc"; never chosen), each checked
against torch.matmul, then timed with bench/common.time_modes (eager_us: calls queued back
to back; graph_us: replayed from one CUDA graph; host_us). `table` marks the candidate the
package's tables pick now (this GPU's, or the nearest measured: gemm_tables.py). Split-K
candidates (_sk<n>) run split_k_for's K slices (column split_k); where that is 1 they are
their base candidate's kernel and copy its row (same_as), as do stream-K ones (_streamk)
where stream_k_for gives 0 programs (column stream_k).

Floors, beside every row and beside cuBLAS's time from the same run:
  floor_us       max(hbm_floor_us, flop_floor_us)
  hbm_floor_us   bytes of A, W and C (2 * (M*K + N*K + M*N)) at the HBM read rate measured
                 in this run (a torch.sum over 1 GiB; hbm_read_gbps in the JSON)
  flop_floor_us  2*M*N*K at 750 TFLOP/s (dense bf16 that cuBLAS reaches on random data)
  datasheet_floor_us  the same bytes at the vendor's rate (H100 SXM 3.35 TB/s, H200
                 4.8 TB/s: /work/.library/device HOPPER.md, H200.md), where the GPU is one
  of_floor       floor_us / graph time (1.0 = at the floor); of_floor_eager from the eager
                 time; cublas_of_floor: cuBLAS's, graph; vs_cublas = cuBLAS graph time /
                 this graph time (vs_cublas_eager: eager)
Decode-sized M is W-streaming: hbm_floor_us is the bound there, and the target is
of_floor >= 0.9 at M <= 64 (issue 30).

Nothing can hang the run. Every (shape, candidate) runs in a worker process that holds
the CUDA context (trident/bench/bounded.py), under a limit of --timeout-s seconds: a
candidate that stalls is killed with its worker, reported as status "timeout", and the
next one starts a fresh worker. A candidate whose values differ from torch.matmul's is
reported ("wrong: max err ...") and not timed; one that does not compile or launch is
"error: ...". The whole run stops measuring at 95% of --budget-s (the rest is for
writing the results): what it did not reach is printed and kept in the JSON
(`not_reached`). Column status says what became of each row ("ok" where it was timed).

--update-table PATH (or --write-table) writes this GPU's table into the file PATH, or,
where PATH is a folder, into PATH/gemm_table_<model>.json (gemm_tables.file_for). A new
file holds this GPU's table alone; an existing one keeps its other GPUs' tables, and with
--keep-classes this GPU's classes the run did not measure (so a run over some M only must
write into a copy of the package's file, not a fresh one). Per shape class: the best
geometric-mean vs_cublas over its shapes, and where that is swap-AB or Gluon, the best
plain one (fused_config). Prints a table and a per-class summary; writes JSON
(--out-dir). The run for a GPU's table (an H100's: copy $OUT/gemm_table_h100.json to
trident/ops/):

    PYTHONPATH=. python3 -m trident.bench.gemm --layers llama3 --budget-s 300 \
        --out-dir $OUT --update-table $OUT
Without a GPU: two tiny shapes under the interpreter (paths only), same workers and limits.

One GPU and no peers: time_modes takes a context; the worker makes a one-rank stand-in
(`_Solo`) over a world-1 process group, so the common helpers run unchanged.
"""
from __future__ import annotations

import argparse
import importlib
import math
import statistics
import time

import torch
import torch.distributed as dist

from ..runtime import options
from . import common
from .bounded import BoundedWorker
from .ops import COLUMN_PARALLEL, ROW_PARALLEL

DTYPE = torch.bfloat16
DEFAULT_M = (1, 8, 16, 32, 64, 128, 256, 1024, 4096, 8192)
SQUARES = (4096, 8192)
TOLERANCE = 1e-2        # relative Frobenius error against torch.matmul (bf16 output)
MEASURE_SHARE = 0.95    # of --budget-s spent measuring; the rest writes the results
# The vendor's HBM rates (GB/s) of the GPUs the project runs on (datasheet_floor_us)
DATASHEET_HBM_GBPS = {"NVIDIA H100 80GB HBM3": 3350.0, "NVIDIA H200": 4800.0}
TABLE_ABOUT = ("GEMM configs per GPU model and shape class: trident/ops/gemm_tables.py says how "
               "they are read and chosen; `python -m trident.bench.gemm --update-table PATH` "
               "measures the table of the GPU it runs on")


class _Solo:
    """What bench/common's timing asks of a context, for one process on one device."""

    rank, world_size, group = 0, 1, None

    def __init__(self, device: torch.device, init_group: bool = True):
        self.device = device
        self.backend = "cuda" if device.type == "cuda" else "cpu"
        if init_group and not dist.is_initialized():
            dist.init_process_group("nccl" if self.backend == "cuda" else "gloo",
                                    store=dist.HashStore(), rank=0, world_size=1)

    def barrier(self):
        pass

    def device_barrier(self):
        if self.backend == "cuda":
            torch.cuda.synchronize(self.device)

    def sync(self):
        self.device_barrier()


def shapes(world: int, ms, squares=SQUARES, layers=()) -> list[tuple[str, int, int, int]]:
    """(label, M, N, K) of every benchmark GEMM (of the models whose name holds one of
    `layers`, all without), duplicates dropped."""
    out, seen = [], set()
    keep = lambda model: not layers or any(w in model for w in layers)  # noqa: E731
    for m in ms:
        for model, layer, n_full, k_full in COLUMN_PARALLEL:
            if keep(model):
                out.append((f"{model} {layer} (col)", m, n_full // world, k_full))
        for model, layer, n_full, k_full in ROW_PARALLEL:
            if keep(model):
                out.append((f"{model} {layer} (row)", m, n_full, k_full // world))
    out += [(f"square {s}", s, s, s) for s in squares]
    unique = []
    for label, m, n, k in out:
        if (m, n, k) not in seen:
            seen.add((m, n, k))
            unique.append((label, m, n, k))
    return unique


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-6)).item()


# ------------------------------------------------------------------ the worker's side
_worker: dict = {}      # in the worker process: its context and the current shape's inputs


def _device(index: bool = True) -> torch.device:
    """The GPU (the current one with index=True: the worker's), or the CPU under the
    interpreter."""
    if not torch.cuda.is_available() or options.get("TRITON_INTERPRET"):
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device()) if index else torch.device("cuda")


def read_bandwidth_gbps(device: torch.device, nbytes: int | None = None) -> float:
    """HBM read rate: bytes / time of a torch.sum over a buffer far larger than L2 (1 GiB
    on GPUs; 64 MiB on the CPU, where the figure only lets the floor columns exist)."""
    nbytes = nbytes or ((1 << 30) if device.type == "cuda" else (64 << 20))
    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
    times = []
    for rep in range(6):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            x.sum(dtype=torch.float32)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            x.sum(dtype=torch.float32)
            seconds = time.perf_counter() - t0
        if rep:                                          # the first one warms up
            times.append(seconds)
    del x
    return nbytes / statistics.median(times) / 1e9


def _context() -> _Solo:
    if "ctx" not in _worker:
        _worker["ctx"] = _Solo(_device())
    return _worker["ctx"]


def _inputs(m: int, n: int, k: int):
    """a, w and torch.matmul's a @ w.T for this shape (kept until the next shape)."""
    if _worker.get("shape") != (m, n, k):
        _worker.pop("inputs", None)
        device = _context().device
        gen = torch.Generator(device=device).manual_seed(m * 1_000_003 + n * 1009 + k)
        a = torch.randn(m, k, dtype=DTYPE, device=device, generator=gen)
        w = torch.randn(n, k, dtype=DTYPE, device=device, generator=gen)
        _worker["inputs"] = (a, w, torch.matmul(a, w.t()))
        _worker["shape"] = (m, n, k)
    return _worker["inputs"]


def _callable(cfg: dict | None, desc: str | None, a, w):
    """What one row times: cuBLAS, a config of the GEMM core, or (a test hook) a planted
    function "module:function" called as f(a, w)."""
    from ..ops import gemm
    if cfg is None:
        return lambda: torch.matmul(a, w.t())
    if "plant" in cfg:
        module, name = cfg["plant"].split(":")
        fn = getattr(importlib.import_module(module), name)
        return lambda: fn(a, w)
    return lambda: gemm.matmul(a, w, config=cfg, desc=desc)


def _context_ok() -> bool:
    """Whether this worker's CUDA context still works after an error (an illegal address
    breaks it for good: then the parent replaces the worker)."""
    try:
        _context().device_barrier()
        return True
    except Exception:
        return False


def serve(task: dict) -> dict:
    """The worker's handler (BoundedWorker): "device" -> the device's name, compute
    capability, SMs and HBM read rate; "measure" -> the status and times of one (shape,
    implementation)."""
    ctx = _context()
    if task["kind"] == "device":
        from ..ops import gemm
        name, capability = gemm.gpu_identity(ctx.device)
        return {"device": name, "capability": capability, "sms": gemm.num_sms(ctx.device),
                "hbm_read_gbps": read_bandwidth_gbps(ctx.device)}
    m, n, k = task["M"], task["N"], task["K"]
    try:
        a, w, ref = _inputs(m, n, k)
        fn = _callable(task["config"], task["desc"], a, w)
        out = fn()
        err = rel_error(out, ref)
        if not err <= TOLERANCE:                         # NaN included
            worst = (out.float() - ref.float()).abs().max().item()
            return {"status": f"wrong: max err {worst:.3g} (relative {err:.2e})", "rel_err": err}
        return {"status": "ok", "rel_err": err,
                **common.time_modes_or_skip(ctx, fn, **task["timing"])}
    except Exception as exc:                             # a config that does not fit or compile
        return {"status": f"error: {type(exc).__name__}: {str(exc)[:160]}",
                "restart": not _context_ok()}


# ------------------------------------------------------------------ the parent's side
def timed_at(cfg: dict, m: int) -> bool:
    """Whether a candidate is timed at M rows (module docstring): swap-AB ones up to 256,
    tiles of 128 or 256 rows without swap-AB from M = BM; planted ones always."""
    if "plant" in cfg:
        return True
    if cfg.get("SWAP_AB"):
        return m <= 256
    return cfg["BM"] < 128 or m >= cfg["BM"]


def _impls(m: int, n: int, k: int, candidates: dict, gpu: tuple):
    """(name, config, desc) of one shape's rows: cuBLAS, each candidate timed at this M,
    the table's config (that of gpu, (name, capability)) with in-kernel descriptors."""
    from ..ops import gemm
    rows = [("cublas", None, None)]
    for name, cfg in candidates.items():
        if not timed_at(cfg, m):
            continue
        rows.append((name, cfg, None if "plant" in cfg else
                     "kernel" if cfg.get("WARP_SPECIALIZE") else "host"))
    rows.append(("table:kdesc", gemm.config_for(m, n, k, split_k=True, gpu=gpu), "kernel"))
    return rows


def _floors(m: int, n: int, k: int, gbps: float, device: str | None = None) -> dict:
    """The floors of one shape (module docstring): HBM bytes of A, W and C at `gbps`, flops
    at common.BF16_TFLOPS, and the bytes at the datasheet rate of `device` (if known)."""
    nbytes = 2.0 * (m * k + n * k + m * n)
    hbm = nbytes / (gbps * 1e3)
    flop = 2.0 * m * n * k / (common.BF16_TFLOPS * 1e6)
    sheet = DATASHEET_HBM_GBPS.get(device or "")
    return {"hbm_floor_us": hbm, "flop_floor_us": flop, "floor_us": max(hbm, flop),
            "datasheet_floor_us": max(nbytes / (sheet * 1e3), flop) if sheet else None}


def _outcome_fields(outcome, timeout_s: float) -> dict:
    """The row fields of a worker's answer that is not a measurement."""
    if outcome.status == "timeout":
        return {"status": f"timeout after {timeout_s:.0f} s (worker replaced)"}
    if outcome.status == "budget":
        return {"status": "stopped: the budget ran out during this row"}
    return {"status": f"{outcome.status}: {str(outcome.value)[:200]}"}


def _shape_rows(worker, case, candidates: dict, info: dict, timing: dict,
                timeout_s: float, deadline: float) -> tuple[list[dict], list[str]]:
    """(rows, names not reached before the deadline) of one shape; info: the worker's
    answer to "device"."""
    from ..ops import gemm, gemm_tables
    label, m, n, k = case
    sms, gbps = info["sms"], info["hbm_read_gbps"]
    impls = _impls(m, n, k, candidates, (info["device"], info["capability"]))
    table_cfg = impls[-1][1]
    base = dict(shape=label, M=m, N=n, K=k, shape_class=gemm_tables.shape_class(m, n, k),
                **_floors(m, n, k, gbps, info["device"]))
    rows, missed, done, cublas = [], [], {}, {}
    for name, cfg, desc in impls:
        if time.monotonic() >= deadline:
            missed.append(name)
            continue
        row = {**base, "impl": name, "table": cfg == table_cfg if cfg else None}
        if cfg is not None and desc is not None:
            row["desc"] = desc
            row["split_k"] = gemm.split_k_for(m, n, k, cfg, sms)
            row["stream_k"] = gemm.stream_k_for(m, n, k, cfg, sms)
        basis = gemm.base_candidate(name)
        if row.get("split_k") == 1 and not row.get("stream_k") and basis in done:
            # one slice, no stream-K here: the same kernel as its base candidate
            rows.append({**done[basis], **row, "same_as": basis})
            continue
        task = dict(kind="measure", M=m, N=n, K=k, impl=name, config=cfg, desc=desc,
                    timing=timing)
        outcome = worker.run(task, timeout_s, deadline)
        if outcome.status != "ok":
            rows.append({**row, **_outcome_fields(outcome, timeout_s)})
            continue
        result = dict(outcome.value)
        if result.pop("restart", False):
            worker.restart()
        row.update(result)
        us = common.device_us(row) if row["status"] == "ok" else None
        if row["status"] == "ok" and not us:
            row["status"] = f"not timed: {row.get('graph_note')}"
        if name == "cublas" and us:
            cublas = {"cublas_eager_us": row["eager_us"], "cublas_graph_us": us}
        if us:
            row.update(_versus(row, us, cublas))
            done[name] = row
        rows.append(row)
    return rows, missed


def _versus(row: dict, us: float, cublas: dict) -> dict:
    """A timed row's figures against its floor and against cuBLAS's row of the same run
    (module docstring): of_floor (= vs_floor), of_floor_eager, cublas_of_floor, vs_cublas,
    vs_cublas_eager, and cuBLAS's own times beside."""
    floor, eager = row["floor_us"], row.get("eager_us")
    cub = cublas.get("cublas_graph_us")
    return {"tflops": 2.0 * row["M"] * row["N"] * row["K"] / us / 1e6,
            "vs_floor": floor / us, "of_floor": floor / us,
            "of_floor_eager": common.ratio(floor, eager), **cublas,
            "cublas_of_floor": common.ratio(floor, cub),
            "vs_cublas": common.ratio(cub, us),
            "vs_cublas_eager": common.ratio(cublas.get("cublas_eager_us"), eager)}


def measure(cases, candidates: dict, timing: dict, budget_s: float, timeout_s: float,
            progress=None, start: float | None = None) -> dict:
    """Every (shape, implementation) of `cases`, each in the bounded worker (see the module
    docstring), within MEASURE_SHARE of budget_s from `start` (time.monotonic(), default
    now). Returns {rows, not_reached, device, hbm_read_gbps, worker_restarts}."""
    deadline = (time.monotonic() if start is None else start) + budget_s * MEASURE_SHARE
    worker = BoundedWorker(serve)
    rows, not_reached = [], []
    try:
        info = worker.run({"kind": "device"}, timeout_s, deadline)
        if info.status != "ok":
            return {"rows": [], "device": None, "hbm_read_gbps": None, "worker_restarts":
                    worker.replaced, "failed": _outcome_fields(info, timeout_s)["status"],
                    "not_reached": [dict(shape=c[0], M=c[1], N=c[2], K=c[3], impls="all",
                                         why="no worker started") for c in cases]}
        for case in cases:
            missed = "all"
            if time.monotonic() < deadline:
                if progress is not None:
                    progress.step("x".join(map(str, case[1:])))
                done, missed = _shape_rows(worker, case, candidates, info.value, timing,
                                           timeout_s, deadline)
                rows += done
            if missed:
                not_reached.append(dict(shape=case[0], M=case[1], N=case[2], K=case[3],
                                        impls=missed, why="budget"))
    finally:
        worker.close()
    return {"rows": rows, "not_reached": not_reached, "device": info.value["device"],
            "capability": info.value["capability"], "hbm_read_gbps": info.value["hbm_read_gbps"],
            "worker_restarts": worker.replaced}


def _geomean(values) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def summarize(rows: list[dict]) -> dict:
    """class -> (best candidate, geometric-mean vs_cublas, shapes, {candidate: geomean},
    the best's geometric-mean vs_floor, cuBLAS's geometric-mean of the floor or None)."""
    per: dict = {}
    for r in rows:
        if r["impl"] not in ("cublas", "table:kdesc") and r.get("vs_cublas"):
            per.setdefault(r["shape_class"], {}).setdefault(r["impl"], []).append(r)
    out = {}
    for cls, cands in per.items():
        nshapes = max(len(v) for v in cands.values())
        # a candidate must have run on every shape of its class to be chosen
        means = {c: _geomean([r["vs_cublas"] for r in v]) for c, v in cands.items()
                 if len(v) == nshapes}
        best = max(means, key=means.get)
        cub = [r["cublas_of_floor"] for r in cands[best] if r.get("cublas_of_floor")]
        out[cls] = (best, means[best], nshapes, means,
                    _geomean([r["vs_floor"] for r in cands[best]]),
                    _geomean(cub) if cub else None)
    return out


def gpu_table(result: dict, best: dict, candidates: dict, world: int, date: str,
              source: str = "measured by `python -m trident.bench.gemm --update-table`"):
    """This GPU's gemm_tables.GpuTable from a run (source: how, for its "about"): per
    measured class its best candidate and, where that one is swap-AB or warp-specialised
    Gluon (the fused ops run neither), the best plain one."""
    from ..ops import gemm_tables
    def special(c):                     # configs the fused ops cannot run as they are
        return candidates[c].get("SWAP_AB") or candidates[c].get("GLUON")
    classes = {}
    for cls, (name, mean, count, means, floor, _) in sorted(best.items()):
        entry = {"config": name, "measured": True, "geomean_vs_cublas": round(mean, 3),
                 "geomean_vs_floor": round(floor, 3), "shapes": count, "date": date}
        if special(name):
            plain = {c: v for c, v in means.items() if not special(c)}
            if plain:
                fused = max(plain, key=plain.get)
                entry.update(fused_config=fused, fused_vs_cublas=round(plain[fused], 3))
        classes[cls] = entry
    about = (f"{source} on {result['device']}, "
             f"{date} (world {world} shapes; HBM read {result['hbm_read_gbps']:.0f} GB/s)")
    return gemm_tables.GpuTable(result["device"], tuple(result["capability"] or ()) or None,
                                classes=classes, about=about)


COLUMNS = ["M", "N", "K", "impl", "table", "split_k", "stream_k", "status", "eager_us", "graph_us",
           "cublas_eager_us", "cublas_graph_us", "floor_us", "of_floor", "of_floor_eager",
           "cublas_of_floor", "vs_cublas", "vs_cublas_eager"]


def _print_report(result: dict, best: dict) -> None:
    columns = COLUMNS
    rows = result["rows"]
    common.print_table(rows, columns)
    failed = [r for r in rows if r.get("status") != "ok"]
    print(f"\nHBM read rate (torch.sum, see the module docstring): "
          f"{result['hbm_read_gbps'] or 0:.4g} GB/s; "
          f"{len(rows) - len(failed)} rows timed, {len(failed)} not ({result['worker_restarts']} "
          f"worker(s) replaced)")
    for r in failed:
        print(f"  {r['M']}x{r['N']}x{r['K']} {r['impl']}: {r.get('status')}")
    for miss in result["not_reached"]:
        what = "every implementation" if miss["impls"] == "all" else ", ".join(miss["impls"])
        print(f"  not reached ({miss['why']}): {miss['M']}x{miss['N']}x{miss['K']}: {what}")
    print("\nper shape class: best candidate, geometric mean of cuBLAS time / its time "
          "(graph), its and cuBLAS's geometric mean of the floor, shapes; the table's current "
          "choice")
    for cls in sorted(best, key=_class_order):
        name, mean, count, means, floor, cub = best[cls]
        current = next((r["impl"] for r in rows if r["shape_class"] == cls and r.get("table")), "-")
        cub_text = f"{cub:4.2f}" if cub else "   -"
        print(f"  {cls:<20} {name:<26} {mean:5.3f}x  {floor:4.2f} of the floor (cuBLAS "
              f"{cub_text})  {count:2d} shapes   table now: {current} "
              f"({means.get(current, float('nan')):.3f}x)")


def _class_order(cls: str):
    """Shape classes by M bucket (numerically, "mbig" last), then the rest."""
    m = cls.split("-", 1)[0][1:]
    return (int(m) if m.isdigit() else 1 << 60, cls)


def parser() -> argparse.ArgumentParser:
    """The command line of `python -m trident.bench.gemm` (also what `trident tune --gemm`
    runs it with)."""
    p = argparse.ArgumentParser(prog="python -m trident.bench.gemm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2, help="tensor parallelism of the shapes")
    p.add_argument("--m", default=",".join(map(str, DEFAULT_M)), help="comma-separated total M")
    p.add_argument("--squares", default=",".join(map(str, SQUARES)),
                   help="comma-separated sizes of square problems ('' for none)")
    p.add_argument("--layers", default="", help="comma-separated words: only the layers of "
                   "the models whose name holds one (e.g. llama3); default all")
    p.add_argument("--candidates", default="", help="comma-separated candidates (default: "
                   "gemm_configs.py's SWEPT: all but stream-K, which goes by name only)")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out-dir", default=None)
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="the whole run's time: measuring stops at 95%% of it")
    p.add_argument("--timeout-s", type=float, default=None,
                   help="the most one (shape, candidate) may take, compile, check and timing "
                        "included (default 90 on GPUs, 60 on the CPU emulation)")
    p.add_argument("--update-table", "--write-table", dest="update_table", default=None,
                   metavar="PATH", help="write this GPU's table (the measured best config per "
                   "shape class) into the gemm table file PATH (a folder: its "
                   "gemm_table_<model>.json), keeping other GPUs' tables it holds")
    p.add_argument("--keep-classes", action="store_true", help="with --update-table: keep "
                   "the classes of this GPU's table in that file that this run did not "
                   "measure (e.g. a run over some M only)")
    return p


def run(args: argparse.Namespace, planted: dict | None = None,
        start: float | None = None) -> tuple[dict, dict, dict]:
    """Measure, print the report and write the results JSON, as `args` (from `parser`)
    say; returns (measure's result, summarize's per-class best, the candidates run).
    planted: a test hook, extra candidates name -> "module:function" (called as f(a, w)
    in the worker in place of the GEMM core), e.g. one that never returns."""
    t0 = time.monotonic() if start is None else start
    from ..ops import gemm, gemm_configs

    device = _device(index=False)        # no CUDA context here: the worker makes it
    gpu = device.type == "cuda"
    if gpu:
        ms = [int(x) for x in args.m.split(",") if x]
        squares = [int(x) for x in args.squares.split(",") if x]
        layers = [x.strip() for x in args.layers.split(",") if x.strip()]
        cases = shapes(args.world, ms, squares, layers)
        candidates = dict(gemm_configs.SWEPT)
        if args.candidates:
            unknown = [c for c in args.candidates.split(",") if c not in gemm.KNOWN]
            if unknown:
                p.error(f"unknown candidate(s) {unknown}; choose from {list(gemm.KNOWN)}")
            candidates = {c: gemm.KNOWN[c] for c in args.candidates.split(",")}
        timing = dict(calls=args.calls, reps=args.reps, warmup=2, synced_iters=0)
    else:
        cases = [("tiny", 40, 48, 64), ("tiny odd", 33, 24, 40)]
        candidates = {"interpret": gemm.INTERPRET_CONFIG,
                      "interpret_swab": dict(gemm.INTERPRET_CONFIG, SWAP_AB=True)}
        timing = dict(calls=1, reps=1, warmup=0, synced_iters=0)
    candidates.update({name: {"plant": fn} for name, fn in (planted or {}).items()})
    timeout_s = args.timeout_s or (90.0 if gpu else 60.0)
    result = measure(cases, candidates, timing, args.budget_s, timeout_s,
                     common.Progress(len(cases), "gemm"), start=t0)
    if result.get("failed"):
        print(f"gemm: no worker could start: {result['failed']}")
    best = summarize(result["rows"])
    _print_report(result, best)
    extra = {"dtype": str(DTYPE), "world_for_shapes": args.world, "seconds": time.monotonic() - t0,
             "budget_s": args.budget_s, "timeout_s": timeout_s, "gpu": result["device"],
             "hbm_read_gbps": result["hbm_read_gbps"], "not_reached": result["not_reached"],
             "worker_restarts": result["worker_restarts"],
             "datasheet_hbm_gbps": DATASHEET_HBM_GBPS.get(result["device"] or ""),
             "marked": None if gpu else "cpu-emulation", "summary": {c: {"best": b[0],
             "geomean_vs_cublas": b[1], "shapes": b[2], "all": b[3], "best_vs_floor": b[4],
             "cublas_vs_floor": b[5]} for c, b in best.items()},
             "columns": "status: ok (timed), timeout, wrong, error, died or stopped (budget); "
                        "eager_us/graph_us/host_us: bench/common.time_modes; vs_cublas = cuBLAS "
                        "graph time / this graph time (vs_cublas_eager: eager); cublas_*_us: "
                        "cuBLAS's row of the same run; table: the config the package's tables "
                        "pick now; hbm_floor_us = 2*(M*K+N*K+M*N) bytes at hbm_read_gbps; "
                        "flop_floor_us = flops at 750 TFLOP/s; floor_us = the larger; "
                        "of_floor (= vs_floor) = floor_us / graph time, of_floor_eager from "
                        "the eager time, cublas_of_floor cuBLAS's; datasheet_floor_us: the "
                        "bytes at datasheet_hbm_gbps"}
    path = common.write_results(_Solo(device, init_group=False), "gemm", result["rows"], extra,
                                out_dir=args.out_dir)
    print(f"results: {path}")
    return result, best, candidates


def write_table(path: str, result: dict, best: dict, candidates: dict, world: int,
                keep_others: bool = True, keep_classes: bool = False, **source):
    """Write the GPU's table of a run (gpu_table, source as there) into the table file at
    `path` (gemm_tables.file_at; gemm_tables.update, keep_others as there), listing the
    candidates it names beside the package's (not planted ones); returns (the table, the
    file). keep_classes: the classes of this GPU's table in that file that the run did not
    measure stay (a run over some M only; the file's table must have the same edges)."""
    from ..ops import gemm, gemm_tables
    table = gpu_table(result, best, candidates, world, time.strftime("%Y-%m-%d"), **source)
    path = gemm_tables.file_at(path, table.name)
    old = gemm_tables.read(path)[1].get(table.name) if keep_classes else None
    if old is not None:
        if (edges := (old.m_edges, old.n_edges, old.k_edges)) != (
                table.m_edges, table.n_edges, table.k_edges):
            raise ValueError(f"--keep-classes: the table of {table.name} in {path} has other "
                             f"class edges {edges}; write a whole table instead")
        table.classes = {**old.classes, **table.classes}
        table.about += "; the classes it did not measure kept from the table before"
    listed = {**gemm.KNOWN, **{n: c for n, c in candidates.items() if "plant" not in c}}
    gemm_tables.update(path, table, listed, TABLE_ABOUT, keep_others=keep_others)
    return table, path


def main(argv=None, planted: dict | None = None) -> int:
    """planted: see `run`."""
    t0 = time.monotonic()
    args = parser().parse_args(argv)
    result, best, candidates = run(args, planted, t0)
    if args.update_table:
        if _device(index=False).type != "cuda":
            print("--update-table: nothing measured on the CPU emulation; no table written")
        elif best:
            table, path = write_table(args.update_table, result, best, candidates, args.world,
                                      keep_classes=args.keep_classes)
            print(f"gemm table of {table.name}: {path}")
    print(f"done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
