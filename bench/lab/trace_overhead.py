"""What tracing costs: each kernel timed with TRACE off and on.

    PYTHONPATH=. python -m bench.lab.trace_overhead [--world-size N] [--iters K]

Rows: a memory-bound copy with one "copy" event per 16 KiB tile (the densest use we
expect: events as fine as a kernel's tiles), the same copy as one tile (latency-bound),
the traced ring exchange, and every collective of trident.ccl that exists. Each time is
the median over iterations on each rank, then the maximum over ranks; "per event" is
the extra time divided by the events one call records (programs run in parallel, so it
is the cost on the critical path, not per SM). With tracing off the kernels are the
very code of kernels without tracing (tests/trace/test_compile_switch.py), so "off" is
also the baseline. On the CPU emulation the numbers only show the script works.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from trident.trace import device as trd
from trident.trace import kernel_args, tags

COPY_BLOCK = 4096                    # fp32 elements per tile: 16 KiB


@triton.jit
def _copy_kernel(src, dst, trace_buf, rank, n, BLOCK: tl.constexpr, TRACE: tl.constexpr):
    t = trd.begin(TRACE)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)
    trd.end(trace_buf, t, tags.COPY, rank, TRACE)


def _copy(ctx, src, dst):
    trace_buf, enabled = kernel_args(ctx)
    n = src.numel()
    _copy_kernel[(triton.cdiv(n, COPY_BLOCK),)](src, dst, trace_buf, ctx.rank, n,
                                                BLOCK=COPY_BLOCK, TRACE=enabled)


def _median_us(ctx, fn, iters: int) -> float:
    """Median of `iters` timed calls on this rank (ranks released together), max over ranks."""
    times = []
    for _ in range(iters):
        ctx.barrier()
        if ctx.backend == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    from trident.ccl.nccl import host_device      # the CPU where the host group is gloo
    value = torch.tensor([statistics.median(times)], dtype=torch.float64,
                         device=host_device(ctx))
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=ctx.group)
    return float(value.item())


def _cases(ctx) -> list[tuple[str, object]]:
    from trident import ccl
    from trident.tools.ring import ring_exchange
    gpu = ctx.backend == "cuda"
    big = (64 << 20) // 4 if gpu else 4 * COPY_BLOCK
    cases = []
    for label, n in ((f"copy {big * 4 >> 20} MiB" if gpu else f"copy {big * 4 >> 10} KiB", big),
                     ("copy 16 KiB", COPY_BLOCK)):
        src = torch.randn(n, device=ctx.device)
        dst = torch.empty_like(src)
        cases.append((label, lambda src=src, dst=dst: _copy(ctx, src, dst)))
    n = (1 << 20) if gpu else 2048
    inp = torch.randn(n, device=ctx.device)
    out = torch.empty_like(inp)
    cases.append((f"ring {n * 4 >> 10} KiB", lambda: ring_exchange(ctx, out, inp)))
    if hasattr(ccl, "all_gather"):
        ag_out = torch.empty(ctx.world_size * n, device=ctx.device)
        cases.append((f"all_gather {n * 4 >> 10} KiB", lambda: ctx.all_gather(ag_out, inp)))
    if hasattr(ccl, "all_reduce"):
        ar = torch.randn(n, device=ctx.device)
        cases.append((f"all_reduce {n * 4 >> 10} KiB", lambda: ctx.all_reduce(ar)))
    return cases


def measure(ctx, iters: int = 20) -> list[dict]:
    """One row per case: off_us, on_us, overhead_pct, events per call, ns per event."""
    rows = []
    for label, fn in _cases(ctx):
        fn()                                                  # compile untraced
        off = _median_us(ctx, fn, iters)
        with ctx.trace(None, capacity=1 << 20, print_summary=False) as probe:
            fn()                                              # compile traced, count events
        events = len(probe.events[ctx.rank]) + probe.dropped[ctx.rank]
        with ctx.trace(None, capacity=max(1, events) * (iters + 1) + 16,
                       print_summary=False) as session:
            on = _median_us(ctx, fn, iters)
        assert not any(session.dropped), session.dropped
        rows.append({"case": label, "off_us": off, "on_us": on,
                     "overhead_pct": 100.0 * (on - off) / off, "events_per_call": events,
                     "ns_per_event": 1e3 * (on - off) / max(events, 1)})
    return rows


def _run(ctx, iters: int):
    rows = measure(ctx, iters)
    if ctx.rank == 0:
        what = torch.cuda.get_device_name(ctx.device) if ctx.backend == "cuda" else \
            "CPU emulation (numbers say nothing about GPUs)"
        print(f"tracing overhead, {ctx.world_size} ranks, {what}; median of {iters}, max over ranks")
        cols = list(rows[0])
        cells = [[f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in rows]
        widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
        print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
        for x in cells:
            print("  ".join(v.rjust(w) for v, w in zip(x, widths)))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lab.trace_overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=None,
                        help="ranks (default: every visible GPU, or 2 CPU ranks)")
    parser.add_argument("--iters", type=int, default=None, help="timed calls per case "
                        "(default 50 on GPUs, 3 on CPU)")
    args = parser.parse_args(argv)
    from trident.runtime.launch import default_backend, launch
    backend = default_backend()
    world = args.world_size or (None if backend == "cuda" else 2)
    iters = args.iters or (50 if backend == "cuda" else 3)
    launch(_run, world, iters, backend=backend, heap_size=None if backend == "cuda" else 64 << 20)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
