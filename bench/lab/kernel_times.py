"""Where a small call's device time goes, measured: each call is captured --calls times in
one CUDA graph and replayed (1) under CUDA events, for the time per call, and (2) under
torch's profiler, for the kernels it ran (CUPTI): per call, the time the GPU spent inside
kernels (`kernel_us`, the union of their intervals), the time between the graph's first
and last kernel that no kernel covered (`gap_us`), and per kernel name its count and mean
duration. graph_us - kernel_us is what a call spends outside its kernels (launch of a
graph node, the gaps between them). One rank per GPU; every rank reports.

Cases (issue 39, item 1):
  all_reduce 1 KiB and 16 KiB, bf16: trident lamport (launched with PDL, the default, and
      without: ccl/lamport.py "PDL"; and with 1 and 2 warps a program instead of 4, whose
      wait votes over fewer threads) and one_shot, torch symm-mem one_shot / two_shot, NCCL;
  the MoE round (DeepSeek-V3 experts and top-k) at 1 and 128 tokens per rank: dispatch,
      combine, both, the split round (send halves, then the receive halves), the round
      and the split round with the MoE kernels launched without PDL (moe/plans.py "PDL"),
      and the same at hidden 256, which leaves the bytes out and shows the fixed cost.
--no-pdl launches every kernel of the run plainly (both knobs off: ccl/lamport.py's and
moe/plans.py's), for a whole run to set beside the default one.
On the CPU emulation each case runs once (no graphs, no times): a check that the script
runs.

    PYTHONPATH=. python bench/lab/kernel_times.py [--calls 20] [--only all_reduce|moe]
                                                  [--world N] [--no-pdl]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import torch

import trident as td

SIZES = (1024, 16384)
MOE = (("deepseek-v3", 256, 8, 7168), ("deepseek-v3 hidden 256", 256, 8, 256))
TOKENS = (1, 128)


def graph_of(fn, calls: int) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def events_us(ctx, graph, calls: int, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        ctx.barrier()
        ctx.device_barrier()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        best = min(best, start.elapsed_time(stop) * 1e3 / calls)
    return best


def _union_us(spans) -> tuple[float, float]:
    """(time covered by the spans, time between the first start and the last end not
    covered), in µs."""
    spans = sorted(spans)
    covered, end = 0.0, None
    for a, b in spans:
        if end is None or a > end:
            covered += b - a
            end = b
        elif b > end:
            covered += b - end
            end = b
    return covered, (spans[-1][1] - spans[0][0]) - covered if spans else 0.0


def _profiled(ctx, graph, calls: int) -> dict:
    from torch.profiler import ProfilerActivity, profile
    ctx.barrier()
    ctx.device_barrier()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    spans, per_name = [], defaultdict(list)
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        a, b = e.time_range.start, e.time_range.end
        spans.append((a, b))
        per_name[e.name].append(b - a)
    covered, gap = _union_us(spans)
    return {"kernel_us": covered / calls, "gap_us": gap / calls,
            "kernels": {name: {"per_call": len(d) / calls, "mean_us": sum(d) / len(d)}
                        for name, d in sorted(per_name.items())}}


def _measure(ctx, fn, calls: int, reps: int) -> dict:
    for _ in range(3):
        fn()
    if ctx.backend != "cuda":
        ctx.sync()
        return {"graph_us": None}
    torch.cuda.synchronize()
    ctx.barrier()
    graph = graph_of(fn, calls)
    graph.replay()
    torch.cuda.synchronize()
    row = {"graph_us": events_us(ctx, graph, calls, reps)}
    row.update(_profiled(ctx, graph, calls))
    del graph
    return row


def _all_reduce_cases(ctx):
    from trident.bench.ccl import _torch_symm_mem
    for nbytes in SIZES:
        t = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=ctx.device)
        cases = {f"trident {a}": (lambda a=a: ctx.all_reduce(t, algorithm=a))
                 for a in ("lamport", "one_shot")}
        cases["trident lamport (no PDL)"] = _without_pdl(ctx, cases["trident lamport"],
                                                         _lamport())
        for w in (1, 2):        # the warps knob: fewer warps, cheaper votes per probe
            cases[f"trident lamport ({w} warp{'s' * (w > 1)})"] = (
                lambda w=w: ctx.all_reduce(t, algorithm="lamport", warps=w))
        if ctx.backend == "cuda":
            import torch.distributed as dist
            if dist.get_backend(ctx.group) == "nccl":   # not when ranks share a GPU (gloo)
                cases["nccl"] = lambda: dist.all_reduce(t, group=ctx.group)
            torch_impls, _ = _torch_symm_mem(ctx, nbytes // 2)
            cases.update({f"torch {k.removeprefix('torch_')}": v for k, v in torch_impls.items()})
        for name, fn in cases.items():
            yield {"op": "all_reduce", "bytes": nbytes, "impl": name}, fn


def _lamport():
    from trident.ccl import lamport
    return lamport


def _moe_plans():
    from trident.moe import plans
    return plans


def _without_pdl(ctx, fn, knob):
    """fn with the kernels of `knob` (the module whose PDL switches them: ccl/lamport.py,
    moe/plans.py) launched plainly: its plans are built with knob.PDL off (the plans of
    this rank are dropped before and after, so that the other cases build theirs with
    the run's setting, which `done` puts back)."""
    def call():
        if call.first:
            call.first = False
            call.was = knob.PDL
            ctx.plans.clear()
            knob.PDL = False
        fn()
    call.first, call.was = True, knob.PDL
    call.done = lambda: (setattr(knob, "PDL", call.was), ctx.plans.clear())
    return call


def moe_inputs(ctx, g, experts: int, k: int, hidden: int, tokens: int) -> tuple:
    """An ExpertParallel of that shape (bf16) and one round's inputs on ctx's device, drawn
    from generator g: (ep, x [T, H], topk_idx [T, k], topk_weights [T, k], out [T, H])."""
    ep = td.ExpertParallel(ctx, experts, k, hidden, tokens, dtype=torch.bfloat16)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).to(ctx.device)
    idx = torch.stack([torch.randperm(experts, generator=g)[:k]
                       for _ in range(tokens)]).to(ctx.device)
    w = torch.rand(tokens, k, generator=g).to(ctx.device)
    y = torch.empty(tokens, hidden, dtype=torch.bfloat16, device=ctx.device)
    return ep, x, idx, w, y


def _moe_cases(ctx):
    g = torch.Generator().manual_seed(7 + ctx.rank)
    for model, experts, k, hidden in MOE:
        if ctx.backend != "cuda":                  # the path only: tiny shapes
            experts, k, hidden = 2 * ctx.world_size, 2, 64
        for tokens in TOKENS if ctx.backend == "cuda" else (1, 4):
            ep, x, idx, w, y = moe_inputs(ctx, g, experts, k, hidden, tokens)
            held = {"d": ep.dispatch(x, idx)}

            def both():
                d = ep.dispatch(x, idx)
                ep.combine(d.expert_x, d, w, out=y)

            def split():
                d = ep.dispatch(x, idx, wait=False).wait()
                ep.combine(d.expert_x, d, w, wait=False, out=y).wait()

            def combine():
                ep.combine(held["d"].expert_x, held["d"], w, out=y)

            head = {"op": "moe", "model": model, "tokens": tokens}
            yield {**head, "impl": "dispatch"}, lambda: ep.dispatch(x, idx)
            held["d"] = ep.dispatch(x, idx)
            yield {**head, "impl": "combine"}, combine
            yield {**head, "impl": "round"}, both
            yield {**head, "impl": "round (split)"}, split
            yield {**head, "impl": "round (no PDL)"}, _without_pdl(ctx, both, _moe_plans())
            yield ({**head, "impl": "round (split, no PDL)"},
                   _without_pdl(ctx, split, _moe_plans()))
            ep.close()


def main(ctx, only, calls, reps, pdl=True):
    if not pdl:                        # --no-pdl: every kernel of the run launched plainly
        _lamport().PDL = _moe_plans().PDL = False
    rows = []
    groups = {"all_reduce": _all_reduce_cases, "moe": _moe_cases}
    for name, cases in groups.items():
        if only and name != only:
            continue
        for head, fn in cases(ctx):
            try:
                rows.append({**head, **_measure(ctx, fn, calls, reps)})
            except Exception as e:      # one broken case must not lose the others' rows
                rows.append({**head, "error": f"{type(e).__name__}: {e}"[:300]})
                print(f"kernel_times: {head} failed: {e}", file=sys.stderr)
            if hasattr(fn, "done"):
                fn.done()
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--only", choices=("all_reduce", "moe"), default=None)
    p.add_argument("--world", type=int, default=None)
    p.add_argument("--backend", default=None)
    p.add_argument("--no-pdl", action="store_true",
                   help="launch every kernel without programmatic dependent launch")
    a = p.parse_args()
    ranks = td.launch(main, a.world, a.only, a.calls, a.reps, not a.no_pdl,
                      backend=a.backend)
    import datetime
    import triton
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    json.dump({"what": "graph us per call and the kernels inside it (CUPTI), per rank",
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "device": torch.cuda.get_device_name(0) if gpus else "cpu",
               "gpus": gpus, "world": a.world or gpus, "torch": torch.__version__,
               "triton": triton.__version__,
               "note": "ranks share one GPU (MPS): HBM, not NVLink" if a.world and gpus
                       and a.world > gpus else "",
               "calls": a.calls, "pdl": not a.no_pdl, "ranks": ranks}, sys.stdout, indent=1)
    print()
