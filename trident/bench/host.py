"""Host time of a warm call: the Python that a call with a built launch plan runs, the
kernel left out (`python -m trident.bench.host`).

On GPUs `trident bench` reports host_us (Python wall time per call while queueing), which
mixes trident's Python with the C launch (3-5 us) and needs a GPU. This harness measures
trident's share alone, on the CPU emulation, so it runs anywhere and in CI:

  1. every case is called twice for real (the plan is built; the kernels run under the
     interpreter), on `world` CPU ranks (default 2);
  2. then every plan step is silenced: `Launch.__call__` and the host steps of a plan
     (staging copies) become no-ops, so a call runs exactly trident's warm path -- key,
     lookup, the output allocation where the API returns a fresh tensor, handles -- and
     calls each step's (no-op) entry;
  3. `calls` calls per case are timed with time.perf_counter_ns on rank 0 (the other
     ranks wait off the CPU), in batches of `batch` calls; the figure is the fastest
     batch's ns per call (on a loaded machine, a batch that was not preempted), the
     median beside it.

It also counts, per warm call: torch ops dispatched (a TorchDispatchMode pass, not timed:
e.g. 1 for a fused op that allocates its output, 0 for a collective), plan builds, host
collectives and ctx.sync() calls (both must stay 0: a warm call never synchronises).
`launch-python` is the Python of Launch.__call__'s fast path around a stand-in for the
C launcher (what the GPU adds on top of the rows' figures is that C call); `baseline` is
the timing loop with an empty call (subtract it from a row to get the op alone).

CPU figures are not GPU figures (a slower core, a CPU `torch.empty`), but the Python is
the same, so before/after comparisons of one machine are meaningful.
tests/plans/test_host_time.py runs a few cases briefly with generous bounds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from ..runtime import options
from .counting import count_torch_ops

CALLS, BATCH = 20000, 50


# ---------------------------------------------------------------------------- cases
def _cases(ctx) -> dict:
    """name -> zero-argument callable making one call (tensors made here, once)."""
    from trident.moe import ExpertParallel
    w = ctx.world_size
    f32, bf16 = torch.float32, torch.bfloat16
    kib = 256                                        # fp32 elements in 1 KiB
    cases = {}

    def heap(n, dtype=f32):
        return ctx.zeros(n, dtype=dtype)

    # all_reduce
    for alg in ("one_shot", "two_shot"):
        t = heap(kib)
        cases[f"all_reduce {alg} 1KiB heap"] = lambda t=t, a=alg: ctx.all_reduce(t, algorithm=a)
    t_plain = torch.zeros(kib)
    cases["all_reduce two_shot 1KiB staged"] = \
        lambda: ctx.all_reduce(t_plain, algorithm="two_shot")
    t64 = heap(16 * kib)
    cases["all_reduce auto 64KiB heap"] = lambda: ctx.all_reduce(t64)
    # all_gather
    out, inp = heap(w * kib), heap(kib)
    for alg in ("push", "pull"):
        cases[f"all_gather {alg} 1KiB heap"] = \
            lambda a=alg: ctx.all_gather(out, inp, algorithm=a)
    p_out, p_inp = torch.zeros(w * kib), torch.zeros(kib)
    cases["all_gather pull 1KiB staged"] = \
        lambda: ctx.all_gather(p_out, p_inp, algorithm="pull")
    raw = torch.zeros(2 * kib + 1, dtype=bf16)          # 2-byte aligned: as_words stages
    m_inp = raw[1:1 + 2 * kib]
    m_out = torch.zeros(w * 2 * kib, dtype=bf16)
    cases["all_gather push 1KiB misaligned"] = \
        lambda: ctx.all_gather(m_out, m_inp, algorithm="push")
    g_out, g_inp = heap(w * 16 * kib), heap(16 * kib)
    cases["all_gather auto 64KiB heap"] = lambda: ctx.all_gather(g_out, g_inp)
    # reduce_scatter
    rs_out, rs_inp = heap(kib), heap(w * kib)
    for alg in ("push", "pull"):
        cases[f"reduce_scatter {alg} 1KiB heap"] = \
            lambda a=alg: ctx.reduce_scatter(rs_out, rs_inp, algorithm=a)
    prs_out, prs_inp = torch.zeros(kib), torch.zeros(w * kib)
    cases["reduce_scatter pull 1KiB staged"] = \
        lambda: ctx.reduce_scatter(prs_out, prs_inp, algorithm="pull")
    # all_to_all
    a_out, a_inp = heap(w * 64), heap(w * 64)
    for alg in ("push", "one_shot"):
        cases[f"all_to_all {alg} even heap"] = \
            lambda a=alg: ctx.all_to_all(a_out, a_inp, algorithm=a)
    splits = [64] * w
    cases["all_to_all push splits heap"] = \
        lambda: ctx.all_to_all(a_out, a_inp, out_splits=splits, in_splits=splits,
                               algorithm="push")
    pa_out, pa_inp = torch.zeros(w * 64), torch.zeros(w * 64)
    cases["all_to_all push even staged"] = \
        lambda: ctx.all_to_all(pa_out, pa_inp, algorithm="push")
    # broadcast
    b = heap(kib)
    for alg in ("push", "relay"):
        cases[f"broadcast {alg} 1KiB heap"] = lambda a=alg: ctx.broadcast(b, algorithm=a)
    pb = torch.zeros(kib)
    cases["broadcast relay 1KiB staged"] = lambda: ctx.broadcast(pb, algorithm="relay")
    # fused ops (fused path forced; classic GEMM core unless said)
    m, n, k = 16, 32, 32
    a = torch.randn(m, k, dtype=bf16)
    wt = torch.randn(n, k, dtype=bf16)
    ag_out = torch.empty(w * m, n, dtype=bf16)
    rs_o = torch.empty(m // w, n, dtype=bf16)
    ar_o = torch.empty(m, n, dtype=bf16)
    for op, o in (("all_gather_matmul", ag_out), ("matmul_reduce_scatter", rs_o),
                  ("matmul_all_reduce", ar_o)):
        fn = getattr(ctx, op)
        cases[f"{op} out=None"] = lambda fn=fn: fn(a, wt, algorithm="fused")
        cases[f"{op} out given"] = lambda fn=fn, o=o: fn(a, wt, out=o, algorithm="fused")
    cases["all_gather_matmul gemm=tma out=None"] = \
        lambda: ctx.all_gather_matmul(a, wt, algorithm="fused", gemm="tma")
    # MoE
    experts, topk, hidden, tokens = 2 * w, 2, 64, 4
    ep = ExpertParallel(ctx, experts, topk, hidden, tokens, dtype=bf16)
    x = torch.randn(tokens, hidden, dtype=bf16)
    idx = torch.stack([torch.randperm(experts)[:topk] for _ in range(tokens)]).to(torch.int32)
    weights = torch.rand(tokens, topk)
    y_out = torch.empty(tokens, hidden, dtype=bf16)
    state = {}

    def dispatch():
        state["d"] = ep.dispatch(x, idx)
    cases["moe dispatch wait=True"] = dispatch
    cases["moe dispatch wait=True weights"] = lambda: ep.dispatch(x, idx, topk_weights=weights)
    cases["moe dispatch wait=False + wait()"] = lambda: ep.dispatch(x, idx, wait=False).wait()

    def combine(out=None, wait=True):
        d = state.get("d") or ep.dispatch(x, idx)
        state["d"] = d
        r = ep.combine(d.expert_x, d, weights, out=out, wait=wait)
        return r if wait else r.wait()
    # combine reuses the last dispatch's handle; the dispatch cases run before, so each
    # combine case makes its own dispatch first (in its warm-up), then only combines
    cases["moe combine out=None"] = lambda: combine()
    cases["moe combine out given"] = lambda: combine(y_out)
    cases["moe combine wait=False + wait()"] = lambda: combine(wait=False)
    for name in [c for c in cases if c.startswith("moe combine")]:
        inner = cases[name]

        def fresh(inner=inner):
            state.pop("d", None)
            return inner()
        cases[name] = (fresh, inner)        # (warm-up call, timed call)
    return cases


# ---------------------------------------------------------------------------- silencing
def _noop_step(tensors=()):
    return None


class _SilentGraph:
    """A plan's CUDA graph while silenced: its replay does nothing."""
    @staticmethod
    def replay():
        return None


def _silence(ctx):
    """Make every plan's steps and CUDA graphs no-ops, and keep plans from capturing new
    graphs (which would hold the silenced steps); returns the function that undoes it."""
    from trident.runtime.triton_launch import Launch
    saved_call = Launch.__call__
    Launch.__call__ = lambda self, tensors=(): None
    saved = []
    ctx.plans.drop_shortcuts()      # shortcuts hold plans' runs: fill them again silenced
    silent = _SilentGraph()
    for plan in list(ctx.plans._plans.values()):
        saved.append((plan, plan.steps, plan.run, plan.graph, plan.at_graphs, plan.runs,
                      plan.captures, plan.last_at))
        plan.steps = tuple(s if isinstance(s, Launch) else _noop_step for s in plan.steps)
        run = plan.run
        if not isinstance(run, Launch) and getattr(run, "__self__", None) is not plan:
            plan.run = _noop_step          # a single host step (or a graph replay)
        # a graph made before (a plain tensor's, per address) would run the real kernels
        # on this rank alone; a graph captured now would keep the no-op steps after undo
        plan.graph = silent if plan.graph is not None else None
        plan.at_graphs = dict.fromkeys(plan.at_graphs, silent)
        plan.runs, plan.captures = -(1 << 62), 1 << 62

    def undo():
        Launch.__call__ = saved_call
        for plan, steps, run, graph, at_graphs, runs, captures, last_at in saved:
            plan.steps, plan.run, plan.graph, plan.at_graphs = steps, run, graph, at_graphs
            plan.runs, plan.captures, plan.last_at = runs, captures, last_at
        ctx.plans.drop_shortcuts()
    return undo


def _time(fn, calls: int, batch: int) -> list[float]:
    """ns per call of each batch of `batch` calls (`calls` in all). Short batches: on a
    loaded machine most of them run without being preempted, and the fastest says what
    the code costs."""
    out = []
    clock = time.perf_counter_ns
    for _ in range(max(1, calls // batch)):
        t0 = clock()
        for _ in range(batch):
            fn()
        out.append((clock() - t0) / batch)
    return out


def _launch_python(calls: int, batch: int) -> list[float]:
    """Launch.__call__'s fast path around a stand-in for the C launcher (15 arguments)."""
    from trident.runtime.triton_launch import Launch
    launch = object.__new__(Launch)
    launch.grid, launch.live = (4, 1, 1), ()
    launch.packed = tuple(range(15))
    launch.prefix = (0, 0, 0, None, None, 0, None, None, None)
    launch.tail = launch.prefix + launch.packed

    def fake_c(*args):
        return None

    class Hooks:
        class launch_enter_hook:
            calls = []
    fields = dict(fast=fake_c, device=0, stream=lambda device: 0, hooks=Hooks,
                  direct=True, one_live=None)
    for name, value in fields.items():       # (earlier versions lack some of these)
        if name in Launch.__slots__:
            setattr(launch, name, value)
    return _time(launch, calls, batch)


def measure(ctx, calls: int = CALLS, batch: int = BATCH, only=None) -> dict:
    """Run on every rank: {case: {ns, median_ns, torch_ops, builds, host_collectives,
    syncs}} per warm call of each case (see the module's doc), timed on rank 0 alone (the
    others wait, off the CPU, so that the ranks do not compete for cores)."""
    import torch.distributed as dist
    cases = _cases(ctx)
    if only:
        cases = {k: v for k, v in cases.items() if any(s in k for s in only)}
    for name, fn in cases.items():           # build every plan (real kernels, CPU)
        warm, timed = fn if isinstance(fn, tuple) else (fn, fn)
        warm()
        timed()
    ctx.barrier()
    results = {}
    syncs = [0]
    real_sync = ctx.sync

    def counting_sync():
        syncs[0] += 1
        return real_sync()
    undo = _silence(ctx)
    ctx.sync = counting_sync
    try:
        if ctx.rank == 0:
            base = _time(lambda: None, calls, batch)
            results["baseline (empty call)"] = dict(ns=min(base),
                                                    median_ns=statistics.median(base))
            lp = _launch_python(calls, batch)
            results["launch-python (stand-in C)"] = dict(ns=min(lp),
                                                         median_ns=statistics.median(lp))
            for name, fn in cases.items():
                if isinstance(fn, tuple):       # e.g. combine: a fresh dispatch first
                    fn[0]()
                    fn = fn[1]
                builds, step, syncs[0] = ctx.plans.builds, ctx._host_step, 0
                ops = count_torch_ops(fn)
                ts = _time(fn, calls, batch)
                results[name] = dict(ns=min(ts), median_ns=statistics.median(ts),
                                     torch_ops=ops, builds=ctx.plans.builds - builds,
                                     host_collectives=ctx._host_step - step, syncs=syncs[0])
        dist.barrier(group=ctx.group)
    finally:
        del ctx.sync
        undo()
    ctx.barrier()
    return results


def run(world: int = 2, calls: int = CALLS, batch: int = BATCH, only=None,
        pool=None) -> dict:
    """Measure on `world` CPU ranks (or in `pool`); returns rank 0's results."""
    if pool is not None:
        return pool.run(measure, calls, batch, only)[0]
    options.export_default("TRIDENT_BACKEND", "cpu")
    from trident.runtime.launch import launch
    return launch(measure, world, calls, batch, only, backend="cpu", heap_size=64 << 20,
                  timeout=60.0)[0]


def table(results: dict, before: dict | None = None) -> str:
    cols = ["op", "ns/call"] + (["before", "after/before"] if before else []) + \
        ["median", "torch ops", "builds", "syncs"]
    rows = [cols]
    for name, r in results.items():
        row = [name, f"{r['ns']:.0f}"]
        if before:
            b = before.get(name, {}).get("ns")
            row += [f"{b:.0f}" if b else "-", f"{r['ns'] / b:.2f}" if b else "-"]
        row += [f"{r['median_ns']:.0f}", f"{r.get('torch_ops', 0):g}",
                f"{r.get('builds', 0)}", f"{r.get('syncs', 0)}"]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m trident.bench.host", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--calls", type=int, default=CALLS)
    p.add_argument("--batch", type=int, default=BATCH, help="calls per timed batch")
    p.add_argument("--only", nargs="*", help="cases whose name contains any of these")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--before", help="a --json file of an earlier run to compare with")
    args = p.parse_args(argv)
    results = run(args.world, args.calls, args.batch, args.only)
    before = json.load(open(args.before)) if args.before else None
    print(table(results, before))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
