"""The Lamport all-reduce's launch shape, timed: warps per program (1, 2, 4, 8) at a few
small sizes, from one CUDA graph of --calls calls (device µs per call, max over ranks;
docs/latency.md says why the warps matter: with one warp the wait's reduction stays in the
warp). On the CPU emulation it only runs each shape once (no graphs, no timing).

    PYTHONPATH=. python bench/lab/lamport_warps.py [--sizes 1K,16K,256K] [--calls 50]
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.distributed as dist

import trident as td
from trident.bench.ccl import parse_size

from bench.lab import kernel_times

WARPS = (1, 2, 4, 8)


def _graph_us(ctx, t, warps, calls, reps) -> float:
    def call():
        ctx.all_reduce(t, algorithm="lamport", warps=warps)
    for _ in range(3):
        call()
    ctx.barrier()
    best = kernel_times.events_us(ctx, kernel_times.graph_of(call, calls), calls, reps)
    mine = torch.tensor([best], device=ctx.device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=ctx.group)
    return float(mine)


def main(ctx, sizes, calls, reps):
    rows = []
    for nbytes in sizes:
        t = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=ctx.device)
        for warps in WARPS:
            if ctx.backend != "cuda":
                ctx.all_reduce(t, algorithm="lamport", warps=warps)
                ctx.sync()
                us = None
            else:
                us = _graph_us(ctx, t, warps, calls, reps)
            rows.append({"bytes": nbytes, "warps": warps, "graph_us": us})
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1K,16K,256K")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--world", type=int, default=None)
    p.add_argument("--backend", default=None)
    a = p.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    rows = td.launch(main, a.world, sizes, a.calls, a.reps, backend=a.backend)[0]
    json.dump({"what": "lamport all_reduce, bf16, graph us per call by warps", "rows": rows},
              sys.stdout)
    print()
