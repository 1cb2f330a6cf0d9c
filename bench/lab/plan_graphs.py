"""A/B: an eager call whose plan launches its kernel directly (TRIDENT_PLAN_GRAPHS=multi,
the default) against the same plan replayed as a one-node CUDA graph ("all").

Why: on the H200 host (2 ranks sharing one GPU, 2026-12-04) the torch backend bench gave
a plain tensor's all_reduce (its plan replays a graph per address) 1.8-3.5 us of host per
eager call, a heap tensor's (a direct C launch of the kernel) 5.5-8.7; the C launch alone
is 3.5-4.5 us there (docs/latency.md). If a graph replay is the cheaper launch, the eager
host time of every single-kernel call falls by the difference.

Each case runs `--rounds` rounds per mode, the modes interleaved (multi, all, all, multi,
...), each round from a cleared plan cache (so the plans are built under that mode) and
`--calls` calls after a warm-up: host = Python time per call of the loop, eager = the
loop's time until the device is done, per call (queued back to back). The medians over
rounds, max over ranks (a rank's eager time includes waiting for its peers); device =
the device's us per call when the calls are queued behind a sleep (device-bound: where a
direct launch's PDL overlap and a graph replay's full dependency differ); beside them
the slowest warm-up call (a build, and under "all" the capture of its graph). Cases:
all_reduce of 1 and 16 KiB bf16 heap tensors (auto and lamport) and of a 1 KiB plain
tensor, and the MoE round (DeepSeek-V3 shapes, 128 tokens per rank: dispatch, then
combine into a given output) on GPUs; tiny shapes on the CPU emulation, where there are
no graphs and both modes time the same path (a check that the script runs).

    PYTHONPATH=. python -m bench.lab.plan_graphs [--world 2] [--calls 500] [--rounds 8]
        [--json out.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time

import torch
import triton

import trident as td

MODES = ("multi", "all")


def _cases(ctx):
    """(name, call) pairs: each call is one eager op of the case."""
    from bench.lab.kernel_times import moe_inputs
    gpu = ctx.backend == "cuda"
    out = []
    for kib in (1, 16):
        t = ctx.zeros(kib * 512, dtype=torch.bfloat16)
        for alg in ("auto", "lamport"):
            out.append((f"all_reduce {kib} KiB heap {alg}",
                        lambda t=t, alg=alg: ctx.all_reduce(t, algorithm=alg)))
    plain = torch.zeros(512, dtype=torch.bfloat16, device=ctx.device)
    out.append(("all_reduce 1 KiB plain auto", lambda: ctx.all_reduce(plain)))
    experts, k, hidden, tokens = (256, 8, 7168, 128) if gpu else (2 * ctx.world_size, 2, 64, 4)
    g = torch.Generator().manual_seed(11 + ctx.rank)
    ep, x, idx, w, y = moe_inputs(ctx, g, experts, k, hidden, tokens)

    def moe_round():
        d = ep.dispatch(x, idx)
        ep.combine(d.expert_x, d, w, out=y)
    out.append((f"moe round {tokens} tokens (2 calls)", moe_round))
    return out


def _plans(plans) -> list:
    """What ran: each plan's name, its steps, whether it is a graph (one, or per address),
    and what its run is."""
    return [dict(name=p.name, steps=len(p.steps), graph=p.graph is not None,
                 address_graphs=len(p.at_graphs),
                 run=getattr(p.run, "__name__", type(p.run).__name__))
            for p in plans._plans.values()]


def _device_bound(ctx, fn, calls: int) -> float | None:
    """Device us per call when the device, not the host, is the bottleneck: the calls are
    queued behind a sleep kernel long enough to hold all of them, and timed by events
    from the sleep's end to the last call's. This is where launching with PDL (kernels
    launched directly) and replaying a graph (which starts after its predecessor is fully
    done) can differ. None on the CPU emulation, or when the host did not queue every call
    before the sleep ended (then the figure would be host time)."""
    if ctx.backend != "cuda":
        return None
    clock = time.perf_counter_ns
    cycles = torch.cuda.get_device_properties(ctx.device).clock_rate * 1e3  # per second
    sleep_s = calls * 40e-6 + 2e-3
    ctx.sync()
    ctx.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = clock()
    torch.cuda._sleep(int(sleep_s * cycles))
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    queued = (clock() - t0) / 1e9
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls if queued < sleep_s * 0.8 else None


def _round(ctx, fn, calls: int, warmup: int) -> tuple[float, float, float]:
    """(host us per call, eager us per call, the slowest warm-up call's host us: the
    plans' builds and their graphs' captures)."""
    clock = time.perf_counter_ns
    slowest = 0
    for _ in range(warmup):
        t0 = clock()
        fn()
        slowest = max(slowest, clock() - t0)
    ctx.sync()
    ctx.barrier()
    t0 = clock()
    for _ in range(calls):
        fn()
    host = clock() - t0
    ctx.sync()
    return host / calls / 1e3, (clock() - t0) / calls / 1e3, slowest / 1e3


def main(ctx, calls: int = 500, rounds: int = 8, warmup: int = 20) -> dict:
    plans = ctx.plans
    saved = plans.graphs
    rows: dict = {}
    try:
        for name, fn in _cases(ctx):
            got = {m: {"host_us": [], "eager_us": [], "warmup_max_us": [], "graph": [],
                       "device_us": [], "plans": None} for m in MODES}
            for r in range(rounds):
                for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                    plans.clear()
                    plans.graphs = mode if ctx.backend == "cuda" else "off"
                    host, eager, slowest = _round(ctx, fn, calls, warmup)
                    got[mode]["host_us"].append(host)
                    got[mode]["eager_us"].append(eager)
                    got[mode]["warmup_max_us"].append(slowest)
                    bound = _device_bound(ctx, fn, calls)
                    if bound is not None:
                        got[mode]["device_us"].append(bound)
                    got[mode]["graph"].append(sum(p.graph is not None
                                                  for p in plans._plans.values()))
                    got[mode]["plans"] = _plans(plans)
            rows[name] = {m: {"host_us": statistics.median(v["host_us"]),
                              "eager_us": statistics.median(v["eager_us"]),
                              "warmup_max_us": statistics.median(v["warmup_max_us"]),
                              "device_bound_us": statistics.median(v["device_us"])
                              if v["device_us"] else None,
                              "plans_as_graphs": max(v["graph"]), "plans": v["plans"]}
                          for m, v in got.items()}
    finally:
        plans.clear()
        plans.graphs = saved
    return {"rank": ctx.rank, "device": str(torch.cuda.get_device_name(ctx.device))
            if ctx.backend == "cuda" else "cpu", "rows": rows}


def table(ranks: list) -> str:
    lines = [f"{'case':40s} {'mode':6s} {'host us':>8s} {'eager us':>9s} {'device us':>9s} "
             f"{'warm-up max':>11s} {'graphs':>6s}"]
    for name in ranks[0]["rows"]:
        for mode in MODES:
            host = max(r["rows"][name][mode]["host_us"] for r in ranks)
            eager = max(r["rows"][name][mode]["eager_us"] for r in ranks)
            slowest = max(r["rows"][name][mode]["warmup_max_us"] for r in ranks)
            graphs = ranks[0]["rows"][name][mode]["plans_as_graphs"]
            bound = [r["rows"][name][mode]["device_bound_us"] for r in ranks]
            bound = "-" if None in bound else f"{max(bound):.2f}"
            lines.append(f"{name:40s} {mode:6s} {host:8.2f} {eager:9.2f} {bound:>9s} "
                         f"{slowest:11.1f} {graphs:6d}")
    return "\n".join(lines)


def run(world: int, calls: int = 500, rounds: int = 8, backend: str | None = None,
        warmup: int = 20, pool=None) -> dict:
    ranks = pool.run(main, calls, rounds, warmup) if pool is not None else \
        td.launch(main, world, calls, rounds, warmup, backend=backend)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return dict(what="eager host and device us per call, plans launched directly (multi) "
                     "against replayed as CUDA graphs (all); medians over interleaved "
                     "rounds, per rank", date=now, device=ranks[0]["device"],
                world=len(ranks), torch=torch.__version__, triton=triton.__version__,
                calls=calls, rounds=rounds, ranks=ranks)


def _cli() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default in (("--world", 2), ("--calls", 500), ("--rounds", 8)):
        p.add_argument(flag, type=int, default=default)
    p.add_argument("--backend", default=None)
    p.add_argument("--json", default=None, help="also write the JSON here")
    a = p.parse_args()
    result = run(a.world, a.calls, a.rounds, a.backend)
    print(table(result["ranks"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    _cli()
