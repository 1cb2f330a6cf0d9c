"""A/B: what capturing a plan's steps as a CUDA graph costs an eager caller, with
torch.cuda.graph (what trident/runtime/plans.py `_capture` uses) against
CUDAGraph.capture_begin/end on a side stream (a candidate: docs/latency.md, "Plan graphs").

torch.cuda.graph first synchronises the device, runs the garbage collector and empties
torch's device cache; so a capture made while the caller has work queued waits for that
work, and the caller's next allocations go back to cudaMalloc. A plan's steps allocate
nothing, so the side-stream capture skips all of that.

Each round (the two ways interleaved, A B B A ...) queues `--backlog-us` of device work
on the current stream (torch.cuda._sleep), allocates and frees a tensor so torch's cache
holds a block, then captures three steps like a staged plain all_reduce's (copy in, a
kernel, copy out). It reports the medians of: host us for the capture, whether the
cached block was still reserved after it, and the replayed graph's output check.

    PYTHONPATH=. python -m bench.lab.capture_cost [--rounds 20] [--backlog-us 200]
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

from trident.runtime.plans import _capture as torch_graph


def side_stream(steps, tensors):
    """The candidate: capture_begin/end on a side stream, without torch.cuda.graph's
    device sync and cache emptying."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            for step in steps:
                step(tensors)
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    return graph


WAYS = {"torch.cuda.graph": torch_graph, "capture_begin/end": side_stream}


def _cycles_per_us() -> float:
    return torch.cuda.get_device_properties(0).clock_rate / 1e3  # kHz -> cycles per us


def main(rounds: int = 20, backlog_us: float = 200.0, n: int = 512) -> dict:
    dev = torch.device("cuda")
    src = torch.randn(n, device=dev)
    stage = torch.empty_like(src)
    out = torch.empty_like(src)
    steps = [lambda t: stage.copy_(src), lambda t: stage.mul_(2.0),
             lambda t: out.copy_(stage)]
    cycles = int(backlog_us * _cycles_per_us())
    got = {w: {"capture_us": [], "cache_kept": [], "replay_ok": []} for w in WAYS}
    names = list(WAYS)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            torch.cuda.synchronize()
            block = torch.empty(1 << 20, device=dev)  # 4 MiB into torch's cache
            del block
            reserved = torch.cuda.memory_reserved()
            torch.cuda._sleep(cycles)
            t0 = time.perf_counter_ns()
            graph = WAYS[name](steps, ())
            took = (time.perf_counter_ns() - t0) / 1e3
            kept = torch.cuda.memory_reserved() >= reserved
            out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            got[name]["capture_us"].append(took)
            got[name]["cache_kept"].append(kept)
            got[name]["replay_ok"].append(bool(torch.equal(out, src * 2.0)))
    return {name: {"capture_us": statistics.median(v["capture_us"]),
                   "capture_us_all": v["capture_us"],
                   "cache_kept": all(v["cache_kept"]), "replay_ok": all(v["replay_ok"])}
            for name, v in got.items()}


def _cli() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--backlog-us", type=float, default=200.0)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    rows = {f"backlog {b:g} us": main(a.rounds, b) for b in (0.0, a.backlog_us)}
    for case, row in rows.items():
        for name, v in row.items():
            print(f"{case:16s} {name:18s} capture {v['capture_us']:9.1f} us  "
                  f"cache kept {v['cache_kept']}  replay ok {v['replay_ok']}")
    if a.json:
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        with open(a.json, "w") as f:
            json.dump(dict(what="host us to capture 3 steps as a CUDA graph, medians over "
                                "interleaved rounds", date=now,
                           device=torch.cuda.get_device_name(0), torch=torch.__version__,
                           triton=triton.__version__, rounds=a.rounds, rows=rows), f,
                      indent=1)


if __name__ == "__main__":
    _cli()
