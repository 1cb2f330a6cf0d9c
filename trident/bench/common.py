"""What every `trident bench` suite shares: timing, floors, tables, JSON results, plots.

Timing (`time_modes`) measures a call the two ways it is used, on this rank, then takes
the maximum over ranks (docs/design.md, "Measuring": events around the region, warm-up
first, median of repetitions):
  eager_us   `calls` calls queued back to back from Python after a device barrier, device
             time / calls: what ordinary PyTorch code sees, host launch cost included
  graph_us   the same calls captured in one CUDA graph and replayed, time / calls: the
             device time alone
  host_us    Python wall time per call while the eager batch is queued
  synced_us  (optional) one call launched right after a device barrier, median: the old
             single-call figure, kept because it is cheap; it is neither of the above
On the CPU emulation the host clock is used, graph_us is None and rows are marked
cpu-emulation: they show that the paths run and say nothing about GPU speed.

Where ranks share a GPU (a one-GPU machine runs 2 ranks by default, `default_world`),
every table's headline and the JSON's "marked" say SHARED_GPU (peers reach each other
through HBM, not NVLink), and the baselines that need NCCL (a GPU per rank) are rows
`skipped(NO_NCCL)`; trident's rows, host_us included, are measured as everywhere.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from ..runtime import options

# The rates behind the floors; docs/design.md ("Measuring") says where each comes from.
NVLINK_GBPS = 370.0      # usable one-way NVLink 4 bandwidth per H100/H200
HBM_GBPS = 4300.0        # H200 device-to-device copy, read + write
BF16_TFLOPS = 750.0      # dense bf16 matrix rate

SHARED_GPU = "ranks share one GPU: correctness and host figures, not link speed"
NO_NCCL = "not available: ranks share one GPU (NCCL needs one GPU per rank)"

# Where results go without --out-dir: a folder of the current directory, never the
# package's own checkout (the repository keeps its committed runs in bench/results/).
DEFAULT_OUT_DIR = "trident-results"


def time_us(ctx, fn, warmup: int = 5, iters: int = 20) -> float:
    """Median time of fn() in microseconds on this rank, then the max over ranks."""
    for _ in range(warmup):
        fn()
    times = []
    if ctx.backend == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for s, e in zip(starts, ends):
            ctx.device_barrier()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    else:
        for _ in range(iters):
            ctx.barrier()
            t0 = time.perf_counter()
            fn()
            ctx.sync()
            times.append((time.perf_counter() - t0) * 1e6)
    return max_over_ranks(ctx, statistics.median(times))


CALLS = 50             # calls per eager batch and per captured graph
MIN_CALLS = 5          # ... fewer for a long call, so that a batch stays near MAX_BATCH_MS
MAX_BATCH_MS = 25.0
MODE_COLUMNS = ("eager_us", "graph_us", "host_us", "synced_us")


def time_modes(ctx, fn, calls: int = CALLS, reps: int = 5, warmup: int = 3, graph: bool = True,
               synced_iters: int = 0) -> dict:
    """One call of fn timed eagerly and from a CUDA graph (see the module docstring).

    Returns {eager_us, graph_us, host_us, synced_us, calls, graph_note}, each time the max
    over ranks of this rank's median over `reps` batches. graph=False for a call that cannot
    be captured (one that reads device values on the host); graph_note then says why
    graph_us is None. synced_iters > 0 adds synced_us. Every rank must call it alike.
    """
    calls = _warm(ctx, fn, calls, warmup)
    batches = [_eager_batch(ctx, fn, calls) for _ in range(max(reps, 1))]
    return _modes(ctx, fn, calls, batches, graph, synced_iters)


def time_modes_interleaved(ctx, fns: dict, calls: int = CALLS, reps: int = 5,
                           warmup: int = 3, graph: bool = True, synced_iters: int = 0) -> dict:
    """time_modes_or_skip of several implementations of one call ({name: fn}), their eager
    batches taken in turns: batch 1 of each, then batch 2 of each, and so on. Timing all
    of one implementation's batches before the next's lets a drift of the host's speed (a
    shared machine's: the eager time of a small call is its host time) decide which is
    faster -- and the selector's eager table with it. The graph times (device time) follow,
    one implementation after another. Returns {name: time_modes' dict, or a skip row}."""
    out, live = {}, {}
    for name, fn in fns.items():
        got = _or_skip(ctx, _warm, ctx, fn, calls, warmup)
        if isinstance(got, dict):
            out[name] = got
        else:
            live[name] = (fn, got, [])
    for _ in range(max(reps, 1)):
        for name, (fn, n, batches) in list(live.items()):
            got = _or_skip(ctx, _eager_batch, ctx, fn, n)
            if isinstance(got, dict):
                out[name] = got
                del live[name]
            else:
                batches.append(got)
    for name, (fn, n, batches) in live.items():
        out[name] = _or_skip(ctx, _modes, ctx, fn, n, batches, graph, synced_iters)
    return {name: out[name] for name in fns}


def _warm(ctx, fn, calls: int, warmup: int) -> int:
    """Run fn `warmup` times; the calls per batch (time_modes)."""
    for _ in range(warmup):
        fn()
    return _calls_for(ctx, fn, calls) if ctx.backend == "cuda" else calls


def _modes(ctx, fn, calls: int, batches: list, graph: bool, synced_iters: int) -> dict:
    """time_modes' dict from this rank's eager batches, the graph time and synced_us."""
    gpu = ctx.backend == "cuda"
    graph_us, note = None, ("not capturable (reads device values on the host)" if gpu
                            else "cpu-emulation: no CUDA graphs")
    if gpu and graph:
        graph_us, note = _graph_time(ctx, fn, calls, len(batches))
    eager_us, host_us = _max_over_ranks(ctx, [statistics.median(b[0] for b in batches),
                                              statistics.median(b[1] for b in batches)])
    synced_us = time_us(ctx, fn, warmup=0, iters=synced_iters) if synced_iters else None
    return {"eager_us": eager_us, "graph_us": graph_us, "host_us": host_us,
            "synced_us": synced_us, "calls": calls, "graph_note": note}


def _events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _calls_for(ctx, fn, calls: int) -> int:
    """`calls`, or fewer (at least MIN_CALLS) where a batch would take longer than
    MAX_BATCH_MS; the same number on every rank, since they must make the same calls."""
    start, end = _events()
    ctx.barrier()
    ctx.device_barrier()
    start.record()
    fn()
    fn()
    end.record()
    end.synchronize()
    per_call_ms = max_over_ranks(ctx, start.elapsed_time(end) / 2)
    fit = int(MAX_BATCH_MS / max(per_call_ms, 1e-6))
    return min(calls, max(MIN_CALLS, fit))


def _eager_batch(ctx, fn, calls: int) -> tuple[float, float]:
    """(device time per call, host time per call) of `calls` calls queued back to back,
    starting when every rank's device is idle and past a device barrier. On the CPU
    emulation both come from the host clock, the first up to the end of the work."""
    ctx.barrier()
    if ctx.backend != "cuda":
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        ctx.sync()
        return (time.perf_counter() - t0) * 1e6 / calls, (t1 - t0) * 1e6 / calls
    start, end = _events()
    ctx.device_barrier()
    start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls, (t1 - t0) * 1e6 / calls


@contextlib.contextmanager
def _graph_plans(ctx):
    """Calls inside build the plans that a CUDA-graph capture will use (trident selects
    by device time there, and a plan built during capture is not itself made a graph), so
    that the capture finds their kernels compiled and their workspaces made: making a
    workspace synchronises, which a capture forbids. Eager warm-up does not do this when
    the graph table picks another algorithm than the eager one. A context across nodes
    (trident.WorldContext) builds its plans on its node's Context."""
    contexts = (ctx, ctx.node) if getattr(ctx, "spans_nodes", False) else (ctx,)
    holders = [h for c in contexts for h in (c, getattr(c, "plans", None))
               if callable(getattr(h, "capturing", None))]
    real = [h.capturing for h in holders]
    for h in holders:
        h.capturing = lambda: True
    try:
        yield
    finally:
        for h, fn in zip(holders, real):
            h.capturing = fn


def _graph_time(ctx, fn, calls: int, reps: int) -> tuple[float | None, str | None]:
    """(time per call replayed from one CUDA graph of `calls` calls, max over ranks; why
    None). The warm-up runs on a side stream, as torch's capture rules ask; the capture is
    thread-local, so that NCCL's watchdog thread may query its events meanwhile."""
    graph, note = None, None
    try:
        side = torch.cuda.Stream(device=ctx.device)
        side.wait_stream(torch.cuda.current_stream(ctx.device))
        with torch.cuda.stream(side), _graph_plans(ctx):
            for _ in range(2):
                fn()
        torch.cuda.current_stream(ctx.device).wait_stream(side)
        ctx.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for _ in range(calls):
                fn()
        torch.cuda.synchronize(ctx.device)
    except Exception as exc:
        graph, note = None, f"capture failed: {type(exc).__name__}: {str(exc)[:160]}"
    if max_over_ranks(ctx, float(graph is None)):        # every rank replays, or none
        return None, note or "capture failed on another rank"
    graph.replay()                                       # the first replay uploads it
    times = []
    for _ in range(reps):
        start, end = _events()
        ctx.barrier()
        ctx.device_barrier()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    ctx.barrier()
    del graph
    return max_over_ranks(ctx, statistics.median(times)), None


def time_modes_or_skip(ctx, fn, **options) -> dict:
    """time_modes, or every time None (with a line on rank 0) for an implementation that
    cannot run this size or shape, e.g. out of memory or an op torch lacks here."""
    return _or_skip(ctx, time_modes, ctx, fn, **options)


def _or_skip(ctx, step, *args, **kwargs):
    """step(*args, **kwargs), or time_modes' skip row where it raises (time_modes_or_skip)."""
    try:
        return step(*args, **kwargs)
    except Exception as exc:
        if ctx.rank == 0:
            print(f"\n  skipped: {type(exc).__name__}: {str(exc)[:160]}")
        try:
            ctx.barrier()
        except Exception:
            pass
        return {**dict.fromkeys(MODE_COLUMNS), "calls": None,
                "graph_note": f"skipped: {type(exc).__name__}"}


def skipped(reason: str) -> dict:
    """The timing columns of an implementation not run here, and why (`note`, a column
    of the printed table)."""
    return {**dict.fromkeys(MODE_COLUMNS), "calls": None, "graph_note": reason, "note": reason}


def nccl_runs(ctx) -> bool:
    """Whether the NCCL / torch.distributed baselines can run (not where ranks share a
    GPU: trident/ccl/nccl.py)."""
    from ..ccl import nccl
    return nccl.available(ctx)


def baseline_name(ctx) -> str:
    """The torch.distributed baseline's name in rows and tables: "nccl" on GPUs, "gloo" on
    the CPU emulation (where the process group is gloo)."""
    return "nccl" if ctx.backend == "cuda" else "gloo"


def shares_gpu(ctx) -> bool:
    return bool(getattr(ctx, "shares_device", False)) or _ranks_per_gpu(ctx) > 1


def marked(ctx) -> str | None:
    """What the figures are not: 'cpu-emulation' and/or SHARED_GPU; None on GPUs of
    their own (the JSON's "marked")."""
    marks = (["cpu-emulation"] if ctx.backend != "cuda" else []) + \
        ([SHARED_GPU] if shares_gpu(ctx) else [])
    return "; ".join(marks) or None


def headline(ctx) -> str:
    """The lines printed above every table of a run whose figures are marked ("" if none)."""
    lines = []
    if ctx.backend != "cuda":
        lines.append("cpu-emulation: host-clock times, no CUDA graphs; they say nothing "
                     "about GPU speed")
    if shares_gpu(ctx):
        lines.append(f"{SHARED_GPU} ({getattr(ctx, 'ranks_per_device', '?')} ranks per GPU; "
                     f"NCCL baselines {NO_NCCL})")
    return "\n".join(lines)


def max_over_ranks(ctx, value: float) -> float:
    return _max_over_ranks(ctx, [value])[0]


def _max_over_ranks(ctx, values: list[float]) -> list[float]:
    from ..ccl.nccl import host_device            # the CPU under a gloo group of GPU ranks
    t = torch.tensor(values, dtype=torch.float64, device=host_device(ctx))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.group)
    return t.tolist()


def device_us(t: dict) -> float | None:
    """The device time of a call timed by time_modes: its graph time, or its eager time
    where it has none (not capturable, or the CPU emulation)."""
    return t["graph_us"] or t["eager_us"]


def ratio(base: float | None, mine: float | None) -> float | None:
    """base / mine (a speedup over the baseline), None where either is missing."""
    return base / mine if base and mine else None


def nvlink_floor_us(bytes_per_gpu_one_way: float) -> float:
    """Time to move this many bytes out of (or into) one GPU over NVLink."""
    return bytes_per_gpu_one_way / (NVLINK_GBPS * 1e3)


def fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def device_kind(ctx) -> str:
    if ctx.backend != "cuda":
        return f"cpu-emulation ({platform.processor() or platform.machine()}, {ctx.world_size} ranks)"
    name = torch.cuda.get_device_name(ctx.device)
    if shares_gpu(ctx):
        return f"{ctx.world_size} ranks on {_gpus(ctx)}x {name} (ranks share one GPU)"
    return f"{ctx.world_size}x {name}"


def _gpus(ctx) -> int:
    """GPUs the job's ranks use (round-robin placement, trident/runtime/placement.py)."""
    return -(-ctx.world_size // _ranks_per_gpu(ctx))


def _ranks_per_gpu(ctx) -> int:
    """The job's ranks on each GPU: the context's count, except across nodes, where the
    context counts its node's ranks only (the other nodes' may share the GPU too, as on
    one machine under TRIDENT_NODE_SIZE): there, from the visible GPUs."""
    if getattr(ctx, "spans_nodes", False) and ctx.backend == "cuda":
        return -(-ctx.world_size // min(ctx.world_size, max(1, torch.cuda.device_count())))
    return getattr(ctx, "ranks_per_device", 1)


def default_world(backend: str, cpu: int = 2) -> int:
    """A suite's ranks unless --world-size says: one per GPU, and 2 on a one-GPU machine
    (the ranks share it: correctness and host figures); `cpu` on the CPU emulation."""
    if backend != "cuda":
        return cpu
    from ..runtime.launch import default_world_size
    return max(2, default_world_size(backend))


def metadata(ctx, suite: str) -> dict:
    import triton
    meta = {
        "suite": suite,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": device_kind(ctx),
        "backend": ctx.backend,
        "world_size": ctx.world_size,
        "ranks_per_gpu": _ranks_per_gpu(ctx),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": sys.version.split()[0],
        "env": {k: options.raw(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                             "NVSHMEM_DISABLE_NVLS")},
    }
    topo = getattr(ctx, "topology", None)
    if topo is not None and topo.spans_nodes:     # a WorldContext: say so in the results
        meta["nodes"] = f"{topo.num_nodes}x{topo.node_size} ({topo.source})"
    if ctx.backend == "cuda":
        try:                  # the baselines' version (docs/results.md prints it)
            meta["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:
            pass
        try:
            meta["nvidia_smi_topo"] = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True,
                                                     text=True, timeout=20).stdout
        except Exception:
            pass
    return meta


def gpu_tag(name: str) -> str:
    """The model in a GPU's name, for file names: "NVIDIA H100 80GB HBM3" -> "h100",
    "NVIDIA H200" -> "h200"; else the name's last word."""
    import re
    model = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return (model.group(1) if model else name.split()[-1]).lower()


def write_results(ctx, suite: str, rows: list[dict], extra: dict | None = None,
                  out_dir: str | None = None, path: str | None = None) -> str:
    """Write {metadata, extra, marked, rows} as JSON (rank 0 only) to `path`, or to a file
    of `out_dir` (default ./trident-results) named after the suite, the hardware and the
    date; returns the path.
    "marked" (see `marked`) is this function's to write, whatever `extra` says."""
    out_dir = out_dir or os.path.join(os.getcwd(), DEFAULT_OUT_DIR)
    meta = metadata(ctx, suite)
    tag = "cpu"
    if ctx.backend == "cuda":
        gpu = gpu_tag(torch.cuda.get_device_name(ctx.device))
        tag = (f"{ctx.world_size}on{_gpus(ctx)}x{gpu}" if shares_gpu(ctx) else
               f"{ctx.world_size}x{gpu}")
    if "nodes" in meta:
        tag += f"-nodes{meta['nodes'].split()[0]}"
    path = path or os.path.join(out_dir, f"{suite}-{tag}-{meta['date'][:10]}.json")
    if ctx.rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump({**meta, **(extra or {}), "marked": marked(ctx), "rows": rows}, f,
                      indent=1)
    return path


def suite_parser(prog: str, doc: str, ops: list[str] | None = None) -> argparse.ArgumentParser:
    """The options every suite shares; the suite adds its own."""
    p = argparse.ArgumentParser(prog=prog, description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if ops:
        p.add_argument("--ops", default=",".join(ops), help="comma-separated subset of " + ",".join(ops))
    p.add_argument("--calls", type=int, default=None,
                   help=f"calls per eager batch and per CUDA graph (default {CALLS} on GPUs)")
    p.add_argument("--reps", type=int, default=None, help="batches and graph replays timed "
                   "(median; default 5 on GPUs)")
    p.add_argument("--iters", type=int, default=None, help="runs of synced_us (one call after a "
                   "device barrier); 0 leaves that column out")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--backend", choices=("cuda", "cpu"), default=None)
    p.add_argument("--out-dir", default=None, help=f"folder of the results JSON (and plots); "
                   f"default ./{DEFAULT_OUT_DIR} in the current directory")
    return p


def timing_options(args, gpu: bool, iters: int = 20) -> dict:
    """time_modes' options from a suite's parsed arguments: the defaults keep a GPU run to
    minutes and a CPU-emulation run (which only shows the paths work) to seconds."""
    return {"calls": args.calls or (CALLS if gpu else 2), "reps": args.reps or (5 if gpu else 1),
            "warmup": args.warmup if args.warmup is not None else (3 if gpu else 1),
            "synced_iters": args.iters if args.iters is not None else (iters if gpu else 1)}


def parse_ops(parser: argparse.ArgumentParser, text: str, ops: list[str]) -> list[str]:
    chosen = [o.strip() for o in text.split(",") if o.strip()]
    bad = [o for o in chosen if o not in ops]
    if bad:
        parser.error(f"unknown op(s) {bad}; choose from {ops}")
    return chosen


def print_table(rows: list[dict], columns: list[str], file=sys.stdout) -> None:
    """One line per row; a last column `note` where some row has one (e.g. `skipped`)."""
    if "note" not in columns and any(r.get("note") for r in rows):
        columns = [*columns, "note"]

    def cell(v):
        if isinstance(v, float):
            return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
        return "-" if v is None else str(v)
    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c)
              for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)), file=file)
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)), file=file)


class Progress:
    """A one-line progress bar on stderr (rank 0 only)."""

    def __init__(self, total: int, label: str, enabled: bool = True):
        self.total, self.label, self.done, self.enabled = max(total, 1), label, 0, enabled
        self.t0 = time.monotonic()

    def step(self, what: str = "") -> None:
        self.done += 1
        if self.enabled:
            frac = self.done / self.total
            bar = "#" * int(30 * frac)
            sys.stderr.write(f"\r{self.label} [{bar:<30}] {self.done}/{self.total} "
                             f"{time.monotonic() - self.t0:6.0f}s {what[:40]:<40}")
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def plot(path: str, series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str,
         title: str, logx: bool = True, logy: bool = False) -> str | None:
    """One line per implementation. Returns the PNG path, or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, points in series.items():
        if points:
            xs, ys = zip(*sorted(points))
            ax.plot(xs, ys, marker="o", markersize=3, label=name)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
