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

    trident tune                          # every visible GPU
    trident tune --world-size 2 --quick
"""
from __future__ import annotations

import argparse
import sys

from .bench import ccl, common, selection
from .ccl import tune_cache


def _tune_rank(ctx, sizes, timing, out):
    rows = ccl.measure(ctx, ccl.OPS, sizes, timing, full=False)
    if ctx.rank != 0:
        return None
    meta = common.metadata(ctx, "tune")
    entry = selection.entry(rows, ccl.OPS, meta, timing["calls"])
    doc = {"about": "measured by `trident tune` on this machine; see trident/ccl/selector.py",
           "world_sizes": {str(ctx.world_size): entry}}
    return tune_cache.write(tune_cache.machine_key(ctx.world_size), doc, out), entry


def main(argv=None) -> int:
    from .launch import default_backend, default_world_size, launch
    p = argparse.ArgumentParser(prog="trident tune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=int, default=None, help="ranks (default: every "
                   "visible GPU; 2 on the CPU emulation)")
    p.add_argument("--quick", action="store_true", help="every fourth size instead of every one")
    p.add_argument("--max-size", default=None, help="largest bytes per rank (default 64M; "
                   "1K on the CPU emulation)")
    p.add_argument("--calls", type=int, default=None, help="calls per eager batch and graph")
    p.add_argument("--reps", type=int, default=None, help="batches and replays timed")
    p.add_argument("--out", default=None, help="write here instead of the user's cache")
    args = p.parse_args(argv)
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
