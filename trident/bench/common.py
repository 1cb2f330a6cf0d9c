"""What every `trident bench` suite shares: timing, floors, tables, JSON results, plots.

Timing follows METHOD.md: warm up, then time each repetition with device events after a
stream-ordered device barrier (so ranks start together), take the median per rank and
the maximum over ranks. On the CPU emulation the host clock is used and results are
marked as such -- they say nothing about GPU speed.
"""
from __future__ import annotations

import argparse
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

NVLINK_GBPS = 370.0      # usable one-way NVLink 4 bandwidth per H100/H200 (DESIGN.md floor)
HBM_GBPS = 4300.0        # H200 device-to-device copy, read + write (KINDS.md)
BF16_TFLOPS = 750.0      # dense bf16 matrix rate used for floors (DESIGN.md)

RESULTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "bench", "results")


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


def time_us_or_skip(ctx, fn, warmup: int = 5, iters: int = 20) -> float | None:
    """time_us, or None (with a line on rank 0) for an implementation that cannot run this
    size or shape, e.g. out of memory or an op torch lacks here."""
    try:
        return time_us(ctx, fn, warmup=warmup, iters=iters)
    except Exception as exc:
        if ctx.rank == 0:
            print(f"\n  skipped: {type(exc).__name__}: {str(exc)[:160]}")
        try:
            ctx.barrier()
        except Exception:
            pass
        return None


def max_over_ranks(ctx, value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.group)
    return float(t.item())


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
    return f"{ctx.world_size}x {torch.cuda.get_device_name(ctx.device)}"


def metadata(ctx, suite: str) -> dict:
    import triton
    meta = {
        "suite": suite,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": device_kind(ctx),
        "backend": ctx.backend,
        "world_size": ctx.world_size,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": sys.version.split()[0],
        "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                "NVSHMEM_DISABLE_NVLS")},
    }
    if ctx.backend == "cuda":
        try:
            meta["nvidia_smi_topo"] = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True,
                                                     text=True, timeout=20).stdout
        except Exception:
            pass
    return meta


def write_results(ctx, suite: str, rows: list[dict], extra: dict | None = None,
                  out_dir: str | None = None) -> str:
    """Write {metadata, rows} as JSON (rank 0 only); returns the path."""
    out_dir = out_dir or RESULTS_DIR
    meta = metadata(ctx, suite)
    tag = "cpu" if ctx.backend != "cuda" else f"{ctx.world_size}x" + torch.cuda.get_device_name(
        ctx.device).split()[-1].lower()
    path = os.path.join(out_dir, f"{suite}-{tag}-{meta['date'][:10]}.json")
    if ctx.rank == 0:
        os.makedirs(out_dir, exist_ok=True)
        with open(path, "w") as f:
            json.dump({**meta, **(extra or {}), "rows": rows}, f, indent=1)
    return path


def suite_parser(prog: str, doc: str, ops: list[str] | None = None) -> argparse.ArgumentParser:
    """The options every op-by-op suite shares; the suite adds its own."""
    p = argparse.ArgumentParser(prog=prog, description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if ops:
        p.add_argument("--ops", default=",".join(ops), help="comma-separated subset of " + ",".join(ops))
    p.add_argument("--iters", type=int, default=None, help="timed runs")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--backend", choices=("cuda", "cpu"), default=None)
    p.add_argument("--out-dir", default=None)
    return p


def parse_ops(parser: argparse.ArgumentParser, text: str, ops: list[str]) -> list[str]:
    chosen = [o.strip() for o in text.split(",") if o.strip()]
    bad = [o for o in chosen if o not in ops]
    if bad:
        parser.error(f"unknown op(s) {bad}; choose from {ops}")
    return chosen


def print_table(rows: list[dict], columns: list[str], file=sys.stdout) -> None:
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
