"""`trident tune`: measure which collective algorithm wins on this machine, eagerly and
inside CUDA graphs, and keep the answer for trident to use from then on.

The built-in tables were measured on our machines; on another GPU model, world size or
NVLink topology they are guesses. This runs every collective at sizes 1 KiB .. 64 MiB
per rank (every power of two; --quick: every fourth) with each of trident's algorithms
and NCCL, times each call eagerly (calls queued back to back from Python) and replayed
from a CUDA graph (bench/common.time_modes), derives the selector's eager and graph
tables from the two columns (bench/selection.py) and stores them in the per-user cache
under this machine's key: GPU model, world size and topology (ccl/tune_cache.py). Every
trident process on this machine with that world size selects from them from then on;
`trident info` says which tables are in use. About 2 minutes on 2 GPUs (1 with --quick).

On the CPU emulation it runs tiny sizes, eagerly only (no CUDA graphs there): enough to
check the round trip, not a statement about speed.

`trident tune --gemm` measures the GEMM core's table instead (the config per shape class
that the standalone GEMM and the fused ops' tiles use: trident/ops/gemm_tables.py) on this
machine's GPU (the current CUDA device; one GPU, no ranks): every candidate config against
cuBLAS on the benchmark's shapes, each in a bounded worker, within --budget-s seconds
(`python -m trident.bench.gemm`, whose results JSON goes beside the table). It writes the
table of this GPU model to gemm-table-<model>.json in the same cache folder, and the GEMM
core of every trident process on a GPU of this model uses it from then on, in place of
the package's table; `trident info` says which GEMM table is used. Shape classes the
budget did not reach take the nearest measured M bucket of the tuned table: raise
--budget-s to measure them all. Refused on the CPU emulation: the interpreter's times say
nothing about a GPU.

`trident tune --ops` measures the fused ops' schedules instead (trident/tools/tune_ops.py):
every schedule of all_gather_matmul, matmul_reduce_scatter and matmul_all_reduce at each
M bucket and size class, eagerly and from CUDA graphs, and writes the table that
schedule="auto" reads (trident/ops/auto.py) to ops-<gpu>-w<world>-<topology>.json in the
same cache folder. A cell never names a schedule measured slower than another in the same
run. Not yet run on a GPU: expect several minutes per world size (--quick: a third).

    trident tune                          # every visible GPU
    trident tune --world-size 2 --quick
    trident tune --gemm --budget-s 600    # the GEMM core's table, on this GPU
    trident tune --ops --world-size 2     # the fused ops' schedule table
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from ..runtime import _env
from ..bench import ccl, common, selection
from ..ccl import tune_cache

GEMM_BUDGET_S = 420.0   # seconds of `trident tune --gemm`: the GEMM bench's default
CPU_REFUSAL = ("trident tune --gemm measures the GEMM core on this machine's GPU; there is "
               "none here (CPU emulation): the Triton interpreter's times say nothing about "
               "any GPU, so no table would be worth keeping. Run it on a machine with a GPU.")


def _tune_rank(ctx, sizes, timing, out):
    rows = ccl.measure(ctx, ccl.OPS, sizes, timing, full=False)
    if ctx.rank != 0:
        return None
    meta = common.metadata(ctx, "tune")
    entry = selection.entry(rows, ccl.OPS, meta, timing["calls"])
    doc = {"about": "measured by `trident tune` on this machine; see trident/ccl/selector.py",
           "world_sizes": {str(ctx.world_size): entry}}
    return tune_cache.write(tune_cache.machine_key(ctx.world_size), doc, out), entry


def tune_gemm(budget_s: float, timeout_s: float | None, calls: int | None,
              reps: int | None, out: str | None, force_on_cpu: bool = False) -> int:
    """`trident tune --gemm` (see the module docstring): measure the GEMM candidates on
    this GPU within budget_s seconds and write this model's table to `out` (default: the
    user's cache, gemm_tables.tuned_path). force_on_cpu: a test hook that runs it on the
    CPU emulation (two tiny shapes, a table for the device "cpu") instead of refusing."""
    from ..bench import gemm as bench_gemm
    from ..ops import gemm_tables
    if _env.INTERPRET and not force_on_cpu:
        raise ValueError(CPU_REFUSAL)
    t0 = time.monotonic()
    results_dir = os.path.dirname(os.path.abspath(out)) if out else tune_cache.tune_dir()
    argv = ["--budget-s", str(budget_s), "--out-dir", results_dir]
    for flag, value in (("--timeout-s", timeout_s), ("--calls", calls), ("--reps", reps)):
        if value is not None:
            argv += [flag, str(value)]
    args = bench_gemm.parser().parse_args(argv)
    result, best, candidates = bench_gemm.run(args, start=t0)
    if not best:
        print("trident tune --gemm: no candidate was timed on any shape; no table written "
              f"({result.get('failed') or 'see the rows above'})")
        return 1
    path = out or gemm_tables.tuned_path(result["device"])
    table, path = bench_gemm.write_table(path, result, best, candidates, args.world,
                                         keep_others=False)
    missing = sorted(set(table.all_classes()) - set(table.classes))
    print(f"trident tune --gemm: {table.about}")
    for cls, entry in sorted(table.classes.items()):
        print(f"  {cls:<20} {entry['config']:<25} {entry['geomean_vs_cublas']:5.3f}x cuBLAS")
    if missing:
        print(f"  not measured (the nearest measured M bucket is used): {', '.join(missing)}")
    print(f"written: {path}")
    return 0


OPS_HEAP_GPU = 6 << 30      # the largest shapes' buffers: gathered A, partials, scratch


def tune_ops(world: int, args, gpu: bool, backend: str) -> int:
    """`trident tune --ops` (see the module docstring and trident/tools/tune_ops.py)."""
    from ..runtime.launch import launch
    from . import tune_ops as tuning  # (this function has the module's name)
    timing = common.timing_options(argparse.Namespace(calls=args.calls, reps=args.reps,
                                                      warmup=None, iters=0), gpu)
    path, entries = launch(tuning.tune_rank, world, args.quick, timing, args.out,
                           backend=backend, heap_size=OPS_HEAP_GPU if gpu else 64 << 20)[0]
    print(f"trident tune --ops: {len(entries)} cells at {world} ranks")
    for e in entries:
        times = " ".join(f"{s}={t:.1f}" for s, t in e["times_us"].items())
        print(f"  {e['op']:22} M {e['m_bucket']:>9} {e['class']:>7} {e['mode']:5} "
              f"-> {e['best']:11} ({times})")
    print(f"written: {path}")
    return 0


def main(argv=None, force_on_cpu: bool = False) -> int:
    """force_on_cpu: a test hook, see tune_gemm."""
    from ..runtime.launch import default_backend, default_world_size, launch
    p = argparse.ArgumentParser(prog="trident tune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gemm", action="store_true", help="measure the GEMM core's table on "
                   "this GPU instead of the collectives' tables (see above)")
    p.add_argument("--ops", action="store_true", help="measure the fused ops' schedules "
                   "(schedule='auto''s table) instead of the collectives' tables")
    p.add_argument("--budget-s", type=float, default=None, help="with --gemm: the whole "
                   f"run's seconds (default {GEMM_BUDGET_S:.0f}; measuring stops at 95%% "
                   "of it)")
    p.add_argument("--timeout-s", type=float, default=None, help="with --gemm: the most one "
                   "(shape, candidate) may take (default: the GEMM bench's)")
    p.add_argument("--world-size", type=int, default=None, help="ranks (default: every "
                   "visible GPU; 2 on the CPU emulation)")
    p.add_argument("--quick", action="store_true", help="every fourth size instead of every one")
    p.add_argument("--max-size", default=None, help="largest bytes per rank (default 64M; "
                   "1K on the CPU emulation)")
    p.add_argument("--calls", type=int, default=None, help="calls per eager batch and graph")
    p.add_argument("--reps", type=int, default=None, help="batches and replays timed")
    p.add_argument("--out", default=None, help="write here instead of the user's cache")
    args = p.parse_args(argv)
    if args.gemm:
        given = [f for f, v in (("--world-size", args.world_size), ("--quick", args.quick),
                                ("--max-size", args.max_size), ("--ops", args.ops)) if v]
        if given:
            p.error(f"{', '.join(given)}: options of the collectives' tuning, not of --gemm")
        if _env.INTERPRET and not force_on_cpu:
            p.error(CPU_REFUSAL)
        if args.budget_s is not None and args.budget_s <= 0:
            p.error(f"--budget-s must be positive, got {args.budget_s}")
        return tune_gemm(args.budget_s or GEMM_BUDGET_S, args.timeout_s, args.calls,
                         args.reps, args.out, force_on_cpu)
    if args.budget_s is not None or args.timeout_s is not None:
        p.error("--budget-s and --timeout-s go with --gemm")
    if args.ops and args.max_size:
        p.error("--max-size is an option of the collectives' tuning, not of --ops")
    backend = default_backend()
    gpu = backend == "cuda"
    world = args.world_size or (default_world_size(backend) if gpu else 2)
    if world < 2:
        p.error(f"tuning needs at least 2 ranks, got world size {world}")
    if gpu:
        import torch
        if world > torch.cuda.device_count():
            # ranks sharing a GPU time HBM, not NVLink: such a table would mislead the
            # selector on a machine with a GPU per rank (and NCCL cannot run there)
            p.error(f"tuning measures the links between GPUs: {world} ranks need {world} "
                    f"GPUs, {torch.cuda.device_count()} visible")
    if args.ops:
        return tune_ops(world, args, gpu, backend)
    lo, hi = (1 << 10, 64 << 20) if gpu else (256, 1 << 10)
    hi = ccl.parse_size(args.max_size) if args.max_size else hi
    sizes = ccl.sizes_between(lo, hi, 4 if args.quick or not gpu else 2)
    timing = common.timing_options(argparse.Namespace(calls=args.calls, reps=args.reps,
                                                      warmup=None, iters=0), gpu)
    path, entry = launch(_tune_rank, world, sizes, timing, args.out, backend=backend,
                         heap_size=ccl.heap_bytes(gpu, world, hi))[0]
    print(f"trident tune: {entry['source']}")
    for mode in ("eager", "graph"):
        for op, rows in entry.get(mode, {}).items():
            print(f"  {mode:5} {op:15} {selection.describe_rows(rows)}")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
