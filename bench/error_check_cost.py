"""What the per-call error check costs a warm call (issue 29: budget 0.5 us).

Host time per warm ctx.all_reduce (1 KiB, bf16) with the check as shipped (PlanCache.get
reads the host-visible error word) and with it switched off (a constant word), in the same
processes, interleaved rounds. Prints one JSON line per rank.

    python bench/error_check_cost.py [world]   # GPUs (ranks share one under MPS) or CPU
"""
import json
import sys
import time

import torch

import trident as td

ROUNDS = 7


def _host_us(ctx, t) -> float:
    calls = 2000 if ctx.backend == "cuda" else 20     # the interpreter runs the kernels
    ctx.all_reduce(t)                           # warm: the plan exists
    if ctx.backend == "cuda":
        torch.cuda.synchronize()
    ctx.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        ctx.all_reduce(t)
    took = time.perf_counter() - start
    ctx.barrier()
    return took / calls * 1e6


def measure(ctx):
    t = ctx.zeros(512, dtype=torch.bfloat16)
    watched = (ctx.plans._error, ctx.plans._raise)
    on, off = [], []
    for _ in range(ROUNDS):
        ctx.plans.watch(*watched)
        on.append(_host_us(ctx, t))
        ctx.plans.watch((0,), None)             # the check reads a constant instead
        off.append(_host_us(ctx, t))
    ctx.plans.watch(*watched)
    on.sort(), off.sort()
    return {"rank": ctx.rank, "backend": ctx.backend, "rounds": ROUNDS,
            "host_us_with_check_median": on[ROUNDS // 2],
            "host_us_without_check_median": off[ROUNDS // 2],
            "added_us": on[ROUNDS // 2] - off[ROUNDS // 2]}


if __name__ == "__main__":
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    for row in td.launch(measure, world):
        print(json.dumps(row))
