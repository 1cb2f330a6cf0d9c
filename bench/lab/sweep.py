"""`python -m bench.lab.sweep`: the large-message knobs of every collective, timed
against each other and NCCL in one short run, with the best settings as suggested defaults.

For each op and size (per rank, as in `trident bench ccl`: all_reduce/broadcast the
tensor, all_gather the input block, reduce_scatter the output block, all_to_all the
input; bf16; default 32M, 128M, 512M) it times NCCL and each variant of the op's
large-message algorithm in GRID (algorithm + keyword options: block in bytes per program
step, programs, warps, relay depth/chunk, all_gather order / push_direct). Every variant's
result is checked once against NCCL's (exact for data movement, a bf16 tolerance for
reductions; `ok` in the table) before it is timed. Time: device time per call replayed
from one CUDA graph (bench/common: CUDA events, max over ranks, median over `reps`
replays); on the CPU emulation the host clock (it only shows that the variants run).

Prints a table (busbw with nccl-tests' formulas, ratio to NCCL and to the op's default
variant), writes JSON into --out-dir (default ./trident-results) (sweep-*.json: rows and `suggested`; and
sweep-*-suggested.json: the fastest correct variant per op and size, its options and
margin over the default -- what a lead would copy into the algorithms' defaults or the
selector).

It needs NCCL, so it refuses to run where ranks share a GPU (nor would the times say
anything about NVLink there).

The grid is budgeted to finish in about 90 s on 4x H200 (about 55 variants plus NCCL, some
17 distinct kernels to compile, fewer replays at 512M). Every rank must run the same grid.

    env NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        PYTHONPATH=. python -m bench.lab.sweep
    python -m bench.lab.sweep --ops all_gather --sizes 512M --list
    python -m bench.lab.sweep --backend cpu --world-size 2 --sizes 4K   # paths only
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from trident.bench import common
from trident.bench.ccl import DTYPE, OPS, _algbw_factor, parse_size

MIB = 1 << 20
# Elements per word the kernel moves: data-movement ops run on int32 words
# (ccl.common.as_words), reductions on the tensor's dtype.
WORD = {"all_gather": 4, "all_to_all": 4, "broadcast": 4, "reduce_scatter": 2,
        "all_reduce": 2}
# (label, algorithm, options, sizes in MiB it runs at; None = every size). Options:
# block_b = bytes per program step (turned into `block` words per op), the rest as the
# collective takes them. The first entry of each op is its current default.
GRID = {
    "all_gather": [
        ("pull", "pull", {}, None),
        ("push_direct", "push_direct", {}, None),
        ("push_direct b32K", "push_direct", {"block_b": 32 << 10}, None),
        ("pull order=block", "pull", {"order": "block"}, (128, 512)),
        ("pull b64K", "pull", {"block_b": 64 << 10}, (128, 512)),
        ("push_direct p256 w4", "push_direct", {"programs": 256, "warps": 4}, (512,)),
        ("push_direct p132", "push_direct", {"programs": 132}, (512,)),
    ],
    "reduce_scatter": [
        ("pull", "pull", {}, None),
        ("pull p132", "pull", {"programs": 132}, None),
        ("pull b8K p256 w4", "pull", {"block_b": 8 << 10, "programs": 256, "warps": 4},
         (128, 512)),
        ("pull b32K w16", "pull", {"block_b": 32 << 10, "warps": 16}, (512,)),
    ],
    "all_reduce": [
        ("two_shot", "two_shot", {}, None),
        ("two_shot p132", "two_shot", {"programs": 132}, None),
        ("two_shot b8K p256 w4", "two_shot", {"block_b": 8 << 10, "programs": 256,
                                              "warps": 4}, None),
        ("two_shot b32K w16", "two_shot", {"block_b": 32 << 10, "warps": 16}, (128, 512)),
    ],
    "all_to_all": [
        ("push", "push", {}, None),
        ("push b32K", "push", {"block_b": 32 << 10}, None),
        ("push p132", "push", {"programs": 132}, (128, 512)),
        ("push p256 w4", "push", {"programs": 256, "warps": 4}, (512,)),
    ],
    "broadcast": [
        ("relay", "relay", {}, None),
        ("relay depth8", "relay", {"depth": 8}, None),
        ("relay depth16", "relay", {"depth": 16}, None),
        ("relay depth32", "relay", {"depth": 32}, (128, 512)),
        ("relay depth16 b32K", "relay", {"depth": 16, "block_b": 32 << 10}, (512,)),
    ],
}


def variants(op: str, size: int, gpu: bool) -> list[tuple[str, str, dict]]:
    """(label, algorithm, keyword options for the collective) of `op` at `size` bytes.
    On the CPU emulation every variant runs at every size, with blocks of at most 1 KiB
    (the interpreter), and 2 programs at most: only the paths are checked there."""
    out = []
    for label, alg, opts, sizes in GRID[op]:
        if gpu and sizes is not None and size // MIB not in sizes:
            continue
        kw = {k: v for k, v in opts.items() if k != "block_b"}
        if "block_b" in opts:
            kw["block"] = (opts["block_b"] if gpu else 256) // WORD[op]
        if not gpu and "programs" in kw:
            kw["programs"] = 2
        out.append((label, alg, kw))
    return out


def _buffers(ctx, op, numel):
    """(trident tensors on the heap, NCCL tensors, the input(s) to restore before a check,
    a function that restores them)."""
    w, r = ctx.world_size, ctx.rank
    g = torch.Generator(device=ctx.device).manual_seed(1234 + (0 if op == "broadcast" else r))
    def rnd(n):
        return torch.randn(n, generator=g, device=ctx.device, dtype=torch.float32).to(DTYPE)
    if op in ("all_reduce", "broadcast"):
        x0 = rnd(numel)
        t = ctx.empty(numel, dtype=DTYPE)
        p = torch.empty(numel, dtype=DTYPE, device=ctx.device)
        def restore(bufs, zero=op == "broadcast" and r != 0):
            bufs[0].zero_() if zero else bufs[0].copy_(x0)
        sym, plain = [t], [p]
    else:
        n_out, n_in = {"all_gather": (w * numel, numel), "reduce_scatter": (numel, w * numel),
                       "all_to_all": (numel, numel)}[op]
        x0 = rnd(n_in)
        sym = [ctx.empty(n_out, dtype=DTYPE), ctx.empty(n_in, dtype=DTYPE)]
        plain = [torch.empty(n_out, dtype=DTYPE, device=ctx.device), x0.clone()]
        def restore(bufs):
            bufs[0].zero_()
            bufs[1].copy_(x0)
    return sym, plain, restore


def _call(ctx, op, bufs, alg, kw):
    if op == "all_reduce":
        return lambda: ctx.all_reduce(bufs[0], algorithm=alg, **kw)
    if op == "broadcast":
        return lambda: ctx.broadcast(bufs[0], 0, algorithm=alg, **kw)
    return lambda: getattr(ctx, op)(bufs[0], bufs[1], algorithm=alg, **kw)


def _nccl_call(ctx, op, bufs):
    from trident.ccl import nccl
    return {"all_reduce": lambda: nccl.all_reduce(ctx, bufs[0], "sum"),
            "broadcast": lambda: nccl.broadcast(ctx, bufs[0], 0),
            "all_gather": lambda: nccl.all_gather(ctx, *bufs),
            "reduce_scatter": lambda: nccl.reduce_scatter(ctx, *bufs, "sum"),
            "all_to_all": lambda: nccl.all_to_all(ctx, *bufs, None, None)}[op]


def _mismatch(op, got, ref) -> float:
    """0 when `got` matches NCCL's `ref` (exactly; for the reductions `ref` is NCCL's fp32
    sum and `got` must be within bf16 rounding of it), else the largest error."""
    if op in ("all_reduce", "reduce_scatter"):
        err = ((got.float() - ref.float()).abs() - 2 ** -7 * ref.float().abs() - 1e-3).max()
        return max(float(err), 0.0) if bool(torch.isfinite(err)) else float("inf")
    return 0.0 if torch.equal(got, ref) else float((got.float() - ref.float()).abs().max())


def _time(ctx, fn, timing) -> float | None:
    """Device time per call from one CUDA graph of `calls` calls (median of `reps`
    replays, max over ranks); the host clock on the CPU emulation."""
    for _ in range(timing["warmup"]):
        fn()
    if ctx.backend != "cuda":
        times = []
        for _ in range(timing["reps"]):
            ctx.barrier()
            t0 = time.perf_counter()
            for _ in range(timing["calls"]):
                fn()
            ctx.sync()
            times.append((time.perf_counter() - t0) * 1e6 / timing["calls"])
        return common.max_over_ranks(ctx, statistics.median(times))
    calls = common._calls_for(ctx, fn, timing["calls"])
    us, note = common._graph_time(ctx, fn, calls, timing["reps"])
    if us is None and ctx.rank == 0:
        print(f"\n  no graph time: {note}")
    return us


def measure(ctx, ops, sizes, timing_for) -> list[dict]:
    if not common.nccl_runs(ctx):
        raise ValueError(f"sweep: NCCL, its baseline and reference, is {common.NO_NCCL}; "
                         "and there the times say nothing about NVLink, which the sweep "
                         "tunes for: run it with one GPU per rank")
    w = ctx.world_size
    gpu = ctx.backend == "cuda"
    plan = [(op, size, variants(op, size, gpu)) for op in ops for size in sizes]
    progress = common.Progress(sum(len(v) + 1 for *_, v in plan), "sweep",
                               enabled=ctx.rank == 0)
    rows = []
    for op, size, grid in plan:
        scale, bus, _ = _algbw_factor(op, w)
        timing = timing_for(size)
        numel = max(1, size // DTYPE.itemsize)
        sym, plain, restore = _buffers(ctx, op, numel)
        nccl = _nccl_call(ctx, op, plain)
        restore(plain)
        if op in ("all_reduce", "reduce_scatter"):   # the reference sums in fp32 (NCCL's
            wide = [p.float() for p in plain]         # bf16 ring rounds every partial sum)
            _nccl_call(ctx, op, wide)()
            ref = wide[0]
            del wide
        else:
            nccl()
            ref = plain[0].clone()
        case = []

        def row(label, alg, kw, us, bad):
            case.append({"op": op, "bytes": size, "size": common.fmt_bytes(size),
                         "variant": label, "algorithm": alg, "options": kw, "graph_us": us,
                         "ok": bad == 0, "error": bad or None,
                         "busbw_GBps": scale * size / us / 1e3 * bus if us else None})
        try:
            us = _time(ctx, nccl, timing)
        except Exception as exc:          # never expected; keep the sweep going
            us = None
            if ctx.rank == 0:
                print(f"\n  nccl skipped: {type(exc).__name__}: {str(exc)[:160]}")
        row("nccl", "nccl", {}, us, 0)
        progress.step(f"{op} {common.fmt_bytes(size)} nccl")
        for label, alg, kw in grid:
            fn = _call(ctx, op, sym, alg, kw)
            try:
                restore(sym)
                fn()
                ctx.sync()
                bad = common.max_over_ranks(ctx, _mismatch(op, sym[0], ref))
                us = _time(ctx, fn, timing)
            except Exception as exc:
                if ctx.rank == 0:
                    print(f"\n  {op} {label} skipped: {type(exc).__name__}: {str(exc)[:200]}")
                try:
                    ctx.sync()
                    ctx.barrier()
                except Exception:
                    pass
                bad, us = float("nan"), None
            row(label, alg, kw, us, bad)
            progress.step(f"{op} {common.fmt_bytes(size)} {label}")
        base = case[0]["graph_us"]
        default = case[1]["graph_us"] if len(case) > 1 else None
        for r in case:
            r["vs_nccl"] = common.ratio(base, r["graph_us"])
            r["vs_default"] = common.ratio(default, r["graph_us"])
        rows += case
        for t in sym:
            ctx.free(t)
        del plain, ref, sym
        ctx.barrier()
    return rows


def suggest(rows) -> dict:
    """{op: {size: the fastest correct trident variant, its options, busbw, and its speed
    against the op's default variant and NCCL}}."""
    out: dict = {}
    for op in dict.fromkeys(r["op"] for r in rows):
        for size in dict.fromkeys(r["bytes"] for r in rows if r["op"] == op):
            case = [r for r in rows if r["op"] == op and r["bytes"] == size]
            mine = [r for r in case if r["algorithm"] != "nccl" and r["ok"] and r["graph_us"]]
            if not mine:
                continue
            best = min(mine, key=lambda r: r["graph_us"])
            out.setdefault(op, {})[best["size"]] = {
                "variant": best["variant"], "algorithm": best["algorithm"],
                "options": best["options"], "graph_us": best["graph_us"],
                "busbw_GBps": best["busbw_GBps"], "vs_default": best["vs_default"],
                "vs_nccl": best["vs_nccl"],
                "beats_nccl": bool(best["vs_nccl"] and best["vs_nccl"] >= 1.0)}
    return out


COLUMNS = ["op", "size", "variant", "ok", "graph_us", "busbw_GBps", "vs_nccl", "vs_default"]


def _run(ctx, ops, sizes, timing_for, out_dir):
    t0 = time.monotonic()
    rows = measure(ctx, ops, sizes, timing_for)
    if ctx.rank != 0:
        return None
    if common.headline(ctx):
        print(common.headline(ctx))
    common.print_table(rows, COLUMNS)
    best = suggest(rows)
    print("suggested (fastest correct variant per op and size):")
    for op, by_size in best.items():
        for size, s in by_size.items():
            print(f"  {op:15s} {size:>8s}  {s['variant']:24s} {s['options']}  "
                  f"x{s['vs_default'] or 0:.3f} vs default, x{s['vs_nccl'] or 0:.3f} vs nccl")
    extra = {"dtype": str(DTYPE),
             "about": "graph_us: device time per call replayed from one CUDA graph (max over "
                      "ranks); busbw: nccl-tests' formulas; vs_*: time of NCCL / the op's "
                      "default variant over this one; ok: result checked against NCCL once",
             "grid": {op: [list(v[:3]) + [v[3]] for v in GRID[op]] for op in ops},
             "wall_s": time.monotonic() - t0, "suggested": best}
    path = common.write_results(ctx, "sweep", rows, extra, out_dir=out_dir)
    spath = path[:-len(".json")] + "-suggested.json"
    with open(spath, "w") as f:
        json.dump({**common.metadata(ctx, "sweep"), "suggested": best}, f, indent=1)
    print(f"results: {path}\nsuggested defaults: {spath}\nsweep wall time "
          f"{time.monotonic() - t0:.0f} s")
    return path


def main(argv=None) -> int:
    from trident.runtime.launch import default_backend, default_world_size, launch
    p = argparse.ArgumentParser(prog="python -m bench.lab.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--sizes", default=None, help="comma-separated, default 32M,128M,512M on "
                   "GPUs, 4K on the CPU emulation")
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--backend", choices=("cuda", "cpu"), default=None)
    p.add_argument("--out-dir", default=None)
    p.add_argument("--calls", type=int, default=None, help="calls per CUDA graph (default "
                   f"{common.CALLS}, fewer for long calls)")
    p.add_argument("--reps", type=int, default=None,
                   help="graph replays timed (default 3; 2 from 256 MiB)")
    p.add_argument("--list", action="store_true", help="print the grid and exit")
    args = p.parse_args(argv)
    backend = args.backend or default_backend()
    gpu = backend == "cuda"
    ops = common.parse_ops(p, args.ops, list(OPS))
    sizes = [parse_size(s) for s in (args.sizes or ("32M,128M,512M" if gpu else "4K")).split(",")]
    if args.list:
        total = 0
        for op in ops:
            for size in sizes:
                vs = variants(op, size, gpu)
                total += len(vs)
                for label, alg, kw in vs:
                    print(f"{op:15s} {common.fmt_bytes(size):>8s}  {label:24s} {alg} {kw}")
        print(f"{total} variants (+ {len(ops) * len(sizes)} NCCL)")
        return 0
    world = args.world_size or (default_world_size(backend) if gpu else 2)
    hi = max(sizes)
    heap = max(1 << 30, (world + 3) * hi + (1 << 30)) if gpu else max(64 << 20, 8 * world * hi)
    os.environ.setdefault("TRIDENT_HEAP_SIZE", str(heap))

    def timing_for(size):
        if not gpu:
            return {"calls": args.calls or 1, "reps": args.reps or 1, "warmup": 0}
        return {"calls": args.calls or common.CALLS,
                "reps": args.reps or (2 if size >= 256 * MIB else 3), "warmup": 1}
    launch(_run, world, ops, sizes, _Timing(timing_for), args.out_dir, backend=backend,
           heap_size=heap)
    return 0


class _Timing:
    """timing_for as a picklable object (the ranks are spawned processes)."""

    def __init__(self, fn):
        sizes = (32 * MIB, 128 * MIB, 512 * MIB)
        self.table = {s: fn(s) for s in sizes}
        self.small, self.large = fn(1), fn(1 << 40)

    def __call__(self, size):
        return self.table.get(size, self.large if size >= 256 * MIB else self.small)


if __name__ == "__main__":
    raise SystemExit(main())
