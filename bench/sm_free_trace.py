"""The SM-free receive, shown: a trace of ExpertParallel's split mode with a GEMM between
the send half and the receive half, in which no trident program is resident while the
GEMM runs.

    PYTHONPATH=. python bench/sm_free_trace.py --out-dir OUT     # 2 ranks (one GPU: MPS)
    python bench/sm_free_trace.py --render OUT/sm_free_trace.json OUT/sm_free_trace.png

Each rank, per iteration (DeepEP's hook mode, PR "SM-free normal kernels"):
    h = ep.dispatch(x, topk_idx, wait=False, topk_weights=w)   # send half: returns at once
    GEMM                                                        # [n, n] @ [n, n]
    d = h.wait()                                                # receive half
    expert_y = 2 * d.expert_x                                   # the "experts"
    h = ep.combine(expert_y, d, wait=False)                     # send half
    GEMM
    y = h.wait()                                                # receive half: y = 2 x sum(w)

The trident kernels record their phases with trident's intra-kernel tracing (ctx.trace:
dispatch, combine, wait, recv, ...). The GEMM's span is measured on the same clock
(%globaltimer on GPUs, CLOCK_MONOTONIC on the CPU emulation) by two one-program marker
kernels on the GEMM's stream: the first stores the time when it runs (after every kernel
queued before it), the second, which runs after the GEMM, records the span from that time
to its own start into the trace buffer. The span therefore contains the GEMM (plus the
launch gaps around it), and a trident event inside it would be a trident program running
at the same time as the GEMM on that rank.

Written: OUT/sm_free_trace.json (Perfetto / chrome://tracing: one process per rank,
a "GEMM" thread beside the programs; otherData.sm_free holds the setup and the check)
and OUT/sm_free_trace.png (matplotlib, if installed; --render makes it from a JSON alone,
e.g. on a machine without a GPU). Exit status 1 if any trident event overlaps its rank's
GEMM span. On the CPU emulation (no GPU) the shapes are tiny and the timeline shows the
interpreter's times only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass

import torch

import trident as td  # noqa: F401  (first: picks the GPU or interpreter device helpers)
import triton
import triton.language as tl

import trident.language as tdl
from trident import trace as ttrace
from trident.trace import device as trd

GEMM_TAG = 64                    # a tag of this script's own, outside trident's (trace/tags.py)
GEMM_TID = 1 << 30               # the thread of the GEMM spans in the Chrome trace
OUT_NAME = "sm_free_trace"


@dataclass
class Setup:
    tokens: int = 128            # tokens per rank
    hidden: int = 7168
    experts_per_rank: int = 8
    top_k: int = 8
    gemm_n: int = 4096           # the GEMM between the halves: [n, n] @ [n, n]
    iters: int = 3               # recorded iterations (after `warmup` traced ones)
    warmup: int = 2


TINY = Setup(tokens=4, hidden=128, experts_per_rank=2, top_k=2, gemm_n=32, iters=1,
             warmup=1)


# ---------------------------------------------------------------------------- markers
@triton.jit
def _mark_start(slot):
    tl.store(slot, tl.cast(tdl.timestamp(), tl.int64))


@triton.jit
def _mark_end(slot, trace_buf, rank, TAG: tl.constexpr):
    trd.end(trace_buf, tl.load(slot), TAG, rank, True)


def timed_gemm(ctx, a, b, slot):
    """a @ b between two marker kernels; inside ctx.trace its span becomes an event."""
    buf, on = ttrace.kernel_args(ctx)
    if not on:
        raise RuntimeError("timed_gemm must run inside ctx.trace(...)")
    _mark_start[(1,)](slot)
    c = a @ b
    _mark_end[(1,)](slot, buf, ctx.rank, TAG=GEMM_TAG)
    return c


# ---------------------------------------------------------------------------- record
def _inputs(ctx, s: Setup, dtype):
    g = torch.Generator(device=ctx.device).manual_seed(17 + ctx.rank)
    E = s.experts_per_rank * ctx.world_size
    x = torch.randn(s.tokens, s.hidden, generator=g, device=ctx.device).to(dtype)
    idx = torch.rand(s.tokens, E, generator=g, device=ctx.device).argsort(-1)[:, :s.top_k]
    w = torch.rand(s.tokens, s.top_k, generator=g, device=ctx.device)
    a = torch.randn(s.gemm_n, s.gemm_n, generator=g, device=ctx.device).to(dtype)
    b = torch.randn(s.gemm_n, s.gemm_n, generator=g, device=ctx.device).to(dtype)
    return x, idx, w, a, b


def record(ctx, s: Setup) -> dict | None:
    """Run the split-mode loop on every rank under ctx.trace; rank 0 returns the Chrome
    trace (GEMM spans moved to their own thread, otherData.sm_free filled), others None."""
    dtype = torch.bfloat16 if ctx.backend == "cuda" else torch.float32
    E = s.experts_per_rank * ctx.world_size
    x, idx, w, a, b = _inputs(ctx, s, dtype)
    slot = torch.zeros(1, dtype=torch.int64, device=ctx.device)
    ep = td.ExpertParallel(ctx, E, s.top_k, s.hidden, s.tokens, dtype=dtype)
    try:
        def step():
            h = ep.dispatch(x, idx, wait=False, topk_weights=w)
            timed_gemm(ctx, a, b, slot)
            d = h.wait()
            hc = ep.combine(d.expert_x * 2, d, wait=False)
            timed_gemm(ctx, a, b, slot)
            return hc.wait()

        with ctx.trace(None, print_summary=False):      # compiles the traced kernels
            for _ in range(s.warmup):
                step()
        with ctx.trace(None, print_summary=False) as t:
            for _ in range(s.iters):
                y = step()
        want = (2 * x.float() * w.sum(-1, keepdim=True)).to(dtype)
        tol = 5e-2 if dtype == torch.bfloat16 else 1e-5
        err = ((y.float() - want.float()).abs().max() / want.float().abs().max()).item()
        if not err <= tol:
            raise AssertionError(f"rank {ctx.rank}: combine(2 * dispatch(x)) is off: "
                                 f"max error / max |want| = {err:.3g} > {tol}")
    finally:
        ep.close()
    if ctx.rank != 0:
        return None
    trace = split_gemm_thread(t.trace)
    device = (torch.cuda.get_device_name(ctx.device) if ctx.backend == "cuda"
              else "CPU emulation (Triton interpreter)")
    trace["otherData"]["sm_free"] = {
        "setup": asdict(s), "dtype": str(dtype).replace("torch.", ""), "device": device,
        "ranks_per_device": getattr(ctx, "ranks_per_device", 1),
        "torch": torch.__version__, "triton": triton.__version__,
        "check": analyze(trace)}
    return trace


def split_gemm_thread(trace: dict) -> dict:
    """The marker events (tag GEMM_TAG) renamed "GEMM" and moved to a thread of their
    own in each rank, listed first."""
    events, ranks = [], set()
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e["name"] == f"tag {GEMM_TAG}":
            e = dict(e, name="GEMM", cat="gemm", tid=GEMM_TID)
            ranks.add(e["pid"])
        events.append(e)
    for r in sorted(ranks):
        events.append({"name": "thread_name", "ph": "M", "pid": r, "tid": GEMM_TID,
                       "args": {"name": "GEMM (torch matmul, between marker kernels)"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": r, "tid": GEMM_TID,
                       "args": {"sort_index": -1}})
    return dict(trace, traceEvents=events)


# ---------------------------------------------------------------------------- check
def spans(trace: dict) -> dict:
    """{rank: {"gemm": [(start_us, end_us)], "trident": [(start_us, end_us, name)]}}."""
    out: dict = {}
    for e in trace["traceEvents"]:
        if e.get("ph") != "X":
            continue
        r = out.setdefault(int(e["pid"]), {"gemm": [], "trident": []})
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        if e.get("cat") == "gemm":
            r["gemm"].append((start, end))
        else:
            r["trident"].append((start, end, e["name"]))
    for r in out.values():
        r["gemm"].sort()
        r["trident"].sort()
    return out


def analyze(trace: dict) -> dict:
    """Per rank: the GEMM spans, the trident events that overlap them (must be none), the
    gaps from the last trident event before each GEMM and to the first one after it, and
    the receive halves' waits. ok: every rank has GEMM spans and trident events, and no
    trident event overlaps its own rank's GEMM."""
    ranks, ok = {}, True
    for rank, sp in sorted(spans(trace).items()):
        gemms, tri = sp["gemm"], sp["trident"]
        inside, gaps_before, gaps_after = [], [], []
        for g0, g1 in gemms:
            inside += [(n, round(max(0.0, min(e1, g1) - max(e0, g0)), 3))
                       for e0, e1, n in tri if e0 < g1 and e1 > g0]
            before = [e1 for e0, e1, _ in tri if e1 <= g0]
            after = [e0 for e0, e1, _ in tri if e0 >= g1]
            gaps_before.append(round(g0 - max(before), 3) if before else None)
            gaps_after.append(round(min(after) - g1, 3) if after else None)
        waits = [round(e1 - e0, 3) for e0, e1, n in tri if n == "wait"]
        ranks[str(rank)] = {
            "gemm_us": [round(g1 - g0, 3) for g0, g1 in gemms],
            "trident_events": len(tri),
            "trident_events_in_gemm": len(inside), "overlaps": inside[:10],
            "gap_before_gemm_us": gaps_before, "gap_after_gemm_us": gaps_after,
            "recv_wait_us_max": max(waits) if waits else None}
        ok = ok and bool(gemms) and bool(tri) and not inside
    return {"ok": ok, "ranks": ranks}


def report(check: dict) -> str:
    lines = []
    for rank, r in check["ranks"].items():
        g = r["gemm_us"]
        lines.append(f"rank {rank}: {len(g)} GEMM spans ({min(g, default=0):.1f}-"
                     f"{max(g, default=0):.1f} us), {r['trident_events']} trident events, "
                     f"{r['trident_events_in_gemm']} of them inside a GEMM span; "
                     f"longest wait of a receive half {r['recv_wait_us_max']} us")
    lines.append("no trident program ran during its rank's GEMM" if check["ok"] else
                 "FAILED: trident events overlap a GEMM span (see 'overlaps')")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- render
COLORS = {"dispatch": "tab:blue", "combine": "tab:green", "send": "tab:cyan",
          "wait": "tab:red", "recv": "tab:orange", "GEMM": "tab:gray"}


def render(trace: dict, png: str) -> None:
    """A PNG timeline from the trace alone: per rank a lane of trident events (colour by
    tag) and a lane of GEMM spans, time in us from the first event."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    sp = spans(trace)
    if not sp or not any(r["gemm"] for r in sp.values()):
        raise ValueError("the trace holds no GEMM spans: was it written by "
                         "bench/sm_free_trace.py?")
    check = analyze(trace)
    meta = trace.get("otherData", {}).get("sm_free", {})
    fig, ax = plt.subplots(figsize=(12, 1.2 + 1.1 * len(sp)))
    labels, y = [], 0
    for rank in sorted(sp, reverse=True):
        r = sp[rank]
        for (name, bars) in (("GEMM", [(s, e, "GEMM") for s, e in r["gemm"]]),
                             ("trident", r["trident"])):
            for s, e, n in bars:
                ax.broken_barh([(s, max(e - s, 1e-3))], (y + 0.1, 0.8),
                               facecolors=COLORS.get(n, "tab:purple"), alpha=0.75,
                               edgecolor="none")
            labels.append(f"rank {rank}: {name}")
            y += 1
        for s, e in r["gemm"]:                     # the GEMM's span across the rank's lanes
            ax.axvspan(s, e, ymin=(y - 2) / (2 * len(sp)), ymax=y / (2 * len(sp)),
                       color="tab:gray", alpha=0.12, lw=0)
    ax.set_ylim(0, y)
    ax.set_yticks([i + 0.5 for i in range(y)], labels)
    ax.set_xlabel("time (us, one clock for all ranks)")
    inside = sum(r["trident_events_in_gemm"] for r in check["ranks"].values())
    setup = meta.get("setup", {})
    ax.set_title(
        f"ExpertParallel split mode: send half, GEMM, receive half ({meta.get('device', '?')}, "
        f"{len(sp)} ranks; T={setup.get('tokens')}, H={setup.get('hidden')}, "
        f"top-{setup.get('top_k')}, GEMM {setup.get('gemm_n')}^3)\n"
        f"trident events inside their rank's GEMM span: {inside}", fontsize=9)
    seen = {n for r in sp.values() for _, _, n in r["trident"]} | {"GEMM"}
    ax.legend(handles=[Patch(color=c, label=n) for n, c in COLORS.items() if n in seen],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    folder = os.path.dirname(os.path.abspath(png))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(png, dpi=150)
    plt.close(fig)


# ---------------------------------------------------------------------------- main
def run(out_dir: str, world: int, s: Setup | None = None, png: bool = True) -> dict:
    from trident.runtime.launch import default_backend
    if s is None:
        s = TINY if default_backend() == "cpu" else Setup()
    heap = td.ExpertParallel.heap_bytes(world, s.top_k, s.hidden, s.tokens) + (64 << 20)
    trace = td.launch(record, world, s, heap_size=max(heap, 256 << 20))[0]
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, OUT_NAME + ".json")
    with open(path, "w") as f:
        json.dump(trace, f, separators=(",", ":"))
    print(f"trace: {path} (open it in ui.perfetto.dev)")
    if png:
        try:
            render(trace, os.path.join(out_dir, OUT_NAME + ".png"))
            print(f"timeline: {os.path.join(out_dir, OUT_NAME + '.png')}")
        except ImportError:
            print("timeline: not drawn (no matplotlib; pip install matplotlib, then --render)")
    return trace


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--render", nargs=2, metavar=("TRACE_JSON", "PNG"),
                   help="only draw the PNG timeline of a trace this script wrote")
    p.add_argument("--out-dir", default=os.path.join("trident-results", "sm-free"),
                   help="where the trace and the PNG go (default ./trident-results/sm-free)")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--tiny", action="store_true",
                   help="tiny shapes (the default on the CPU emulation)")
    p.add_argument("--no-png", action="store_true")
    args = p.parse_args(argv)
    if args.render:
        with open(args.render[0]) as f:
            trace = json.load(f)
        render(trace, args.render[1])
        check = analyze(trace)
        print(report(check))
        return 0 if check["ok"] else 1
    trace = run(args.out_dir, args.world_size, TINY if args.tiny else None,
                png=not args.no_png)
    check = trace["otherData"]["sm_free"]["check"]
    print(report(check))
    return 0 if check["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
