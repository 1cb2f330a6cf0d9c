"""Where an MoE dispatch's and combine's device time goes, phase by phase, from the kernels'
own trace events (trident.trace: %globaltimer, one clock for every GPU of the node, so a
rank's wait lines up with the peer's send it waits for).

Each call runs alone in its own trace session (all ranks enter it together, the call, a
barrier, the events gathered), after a traced warm-up call that compiles the TRACE=True
kernels. Per call and rank, relative to the call's first event on any rank (t0, µs):

    phase  first start, last end   of each tag's events (send programs' `dispatch` /
                                   `combine`, weight programs' `send`, `wait`, `recv`)

and, derived from them, the critical path of one launch:

    send      the send programs' span on this rank (first start to last end)
    handoff   this rank's last wait end - the latest peer's last send end: what the flag
              costs after the data -- the senders' last-program count, the system fence,
              the flag's flight and the poll that sees it
    receive   the receivers' last `recv` end - their last `wait` end: copying the tokens
              out (dispatch) or summing the partials (combine), then the last program
    in-kernel the last event's end on this rank - t0

A kernel's launch, its first program's start and its last program's exit are outside
the events: graph_us of bench/lab/kernel_times.py minus in-kernel is that part. The
medians over --calls calls are printed per rank and kept in the JSON.

On the CPU emulation the events are host clock times of the Triton interpreter: the
script runs (tests/test_moe_phases.py), its figures mean nothing.

    PYTHONPATH=. python bench/lab/moe_phases.py [--calls 10] [--tokens 1,128] [--world N]
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys

import numpy as np
import torch

import trident as td
from trident.trace.tags import name as tag_name

MODELS = (("deepseek-v3", 256, 8, 7168), ("deepseek-v3 hidden 256", 256, 8, 256))


def windows(events: list[np.ndarray]) -> dict:
    """{rank: {tag: (first start, last end)}} in µs from the call's first event on any
    rank, and t0 (ns)."""
    starts = [ev[:, 0].min() for ev in events if len(ev)]
    t0 = min(starts) if starts else 0
    out = {}
    for rank, ev in enumerate(events):
        out[rank] = {tag_name(tag): (float(ev[ev[:, 2] == tag, 0].min() - t0) / 1e3,
                                     float(ev[ev[:, 2] == tag, 1].max() - t0) / 1e3)
                     for tag in np.unique(ev[:, 2])} if len(ev) else {}
    return out


def critical_path(win: dict, send_tag: str) -> dict:
    """The derived phases of one call (see the module docstring), per rank."""
    ends = {r: w[send_tag][1] for r, w in win.items() if send_tag in w}
    rows = {}
    for r, w in win.items():
        row = {}
        if send_tag in w:
            row["send"] = w[send_tag][1] - w[send_tag][0]
        if "wait" in w and ends:
            row["handoff"] = w["wait"][1] - max(ends.values())
        if "recv" in w and "wait" in w:
            row["receive"] = w["recv"][1] - w["wait"][1]
        if w:
            row["in-kernel"] = max(end for _, end in w.values())
        rows[r] = row
    return rows


def _traced(ctx, fn) -> list[np.ndarray]:
    with ctx.trace(None, capacity=1 << 14, print_summary=False) as t:
        fn()
    return t.events


def _median_rows(calls: list[dict]) -> dict:
    """Per rank and figure, the median over the calls."""
    out = {}
    for r in calls[0]:
        keys = {k for c in calls for k in c.get(r, {})}
        out[r] = {k: statistics.median(c[r][k] for c in calls if k in c.get(r, {}))
                  for k in sorted(keys)}
    return out


def _cases(ctx, tokens_list):
    from bench.lab.kernel_times import moe_inputs
    g = torch.Generator().manual_seed(11 + ctx.rank)
    for model, experts, k, hidden in MODELS:
        if ctx.backend != "cuda":                  # the path only: tiny shapes
            experts, k, hidden = 2 * ctx.world_size, 2, 64
        for tokens in tokens_list:
            ep, x, idx, w, y = moe_inputs(ctx, g, experts, k, hidden, tokens)
            held = {"d": None}

            def dispatch():
                held["d"] = ep.dispatch(x, idx)

            def combine():
                ep.combine(held["d"].expert_x, held["d"], w, out=y)

            head = {"model": model, "tokens": tokens, "hidden": hidden}
            yield {**head, "op": "dispatch", "send_tag": "dispatch"}, dispatch
            yield {**head, "op": "combine", "send_tag": "combine"}, combine
            ep.close()


def main(ctx, calls: int, tokens_list) -> list[dict]:
    rows = []
    for head, fn in _cases(ctx, tokens_list):
        send_tag = head.pop("send_tag")
        _traced(ctx, fn)                           # compiles the TRACE=True kernels
        per_call, wins = [], []
        for _ in range(calls):
            ctx.barrier()
            win = windows(_traced(ctx, fn))
            wins.append(win)
            per_call.append(critical_path(win, send_tag))
        rows.append({**head, "median_us": _median_rows(per_call),
                     "windows_us": {r: {t: [round(a, 3), round(b, 3)] for t, (a, b) in w.items()}
                                    for r, w in wins[len(wins) // 2].items()}})
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'case':<42} {'rank':>4} {'send':>8} {'handoff':>8} {'receive':>8} "
             f"{'in-kernel':>9}"]
    for row in rows:
        case = f"{row['op']} {row['model']} T={row['tokens']}"
        for r, m in row["median_us"].items():
            cells = [f"{m[k]:8.2f}" if k in m else f"{'-':>8}"
                     for k in ("send", "handoff", "receive")]
            lines.append(f"{case:<42} {r:>4} {' '.join(cells)} {m.get('in-kernel', 0):9.2f}")
    return "\n".join(lines)


def run(world: int | None, calls: int = 10, tokens=(1, 128), pool=None) -> dict:
    """The whole measurement (a RankPool `pool` to run on instead of td.launch: tests)."""
    ranks = pool.run(main, calls, tokens) if pool is not None else \
        td.launch(main, world, calls, tokens)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    import triton
    world = len(ranks)
    return {"what": "MoE dispatch / combine phases from the kernels' trace events, µs, "
                    "median over calls (bench/lab/moe_phases.py)",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(0) if gpus else "cpu", "gpus": gpus,
            "world": world, "torch": torch.__version__, "triton": triton.__version__,
            "note": "ranks share one GPU (MPS): HBM, not NVLink" if gpus and world > gpus
                    else "", "calls": calls, "rows": ranks[0]}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--tokens", default="1,128")
    p.add_argument("--world", type=int, default=None)
    a = p.parse_args()
    result = run(a.world, a.calls, tuple(int(t) for t in a.tokens.split(",")))
    print(table(result["rows"]), file=sys.stderr)
    json.dump(result, sys.stdout, indent=1)
    print()
