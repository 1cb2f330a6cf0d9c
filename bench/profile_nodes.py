"""Launches and host time per warm call of the paths across nodes, on GPUs:
`python bench/profile_nodes.py [--world 2 --node-size 1]` (TRIDENT_NODE_SIZE is set for
the ranks). For each call: CUDA activities per call (kernels, memcpys, memsets, counted by
torch.profiler over 10 warm calls), host us per call (Python time of 100 calls queued
back to back, rank 0), for the hierarchical collective and for the same op on ctx.node
(one node's ranks: the single-node op it is built from), and for MoE across nodes."""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import trident as td                                       # noqa: E402
from tests.nodes import pool_in_nodes                      # noqa: E402


def _per_call(ctx, fn, calls=10):
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ctx.barrier()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    ctx.barrier()
    t0 = time.perf_counter()
    for _ in range(100):
        fn()
    host = (time.perf_counter() - t0) / 100 * 1e6
    torch.cuda.synchronize()
    ctx.barrier()
    names = sorted({e.name[:40] for e in events})
    return len(events) / calls, host, names


def run(ctx):
    dev, w, node = ctx.device, ctx.world_size, ctx.node
    n = 256                                            # fp32: 1 KiB per rank
    rows = []
    t, tn = torch.ones(n, device=dev), torch.ones(n, device=dev)
    out, inp = torch.empty(w * n, device=dev), torch.ones(n, device=dev)
    outn = torch.empty(node.world_size * n, device=dev)
    big, part = torch.ones(w * n, device=dev), torch.empty(n, device=dev)
    bign = torch.ones(node.world_size * n, device=dev)
    a2a, a2an = torch.ones(w * n, device=dev), torch.ones(node.world_size * n, device=dev)
    cases = {
        "all_reduce": (lambda: ctx.all_reduce(t, algorithm="hierarchical"),
                       lambda: node.all_reduce(tn)),
        "all_gather": (lambda: ctx.all_gather(out, inp, algorithm="hierarchical"),
                       lambda: node.all_gather(outn, inp)),
        "reduce_scatter": (lambda: ctx.reduce_scatter(part, big, algorithm="hierarchical"),
                           lambda: node.reduce_scatter(part, bign)),
        "all_to_all": (lambda: ctx.all_to_all(big, a2a, algorithm="hierarchical"),
                       lambda: node.all_to_all(bign, a2an)),
        "broadcast": (lambda: ctx.broadcast(t, algorithm="hierarchical"),
                      lambda: node.broadcast(tn)),
    }
    for op, (hier, single) in cases.items():
        for name, fn in (("hierarchical", hier), ("node op", single)):
            launches, host, names = _per_call(ctx, fn)
            rows.append((op, name, launches, host, names))
    E, k, H, T = 256, 8, 7168, 128
    ep = td.ExpertParallel(ctx, E, k, H, T)
    x = torch.randn(T, H, device=dev).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E)[:k] for _ in range(T)]).to(dev)
    wt = torch.rand(T, k, device=dev)
    d = ep.dispatch(x, idx)
    for name, fn in (("dispatch", lambda: ep.dispatch(x, idx)),
                     ("combine", lambda: ep.combine(d.expert_x, d, wt))):
        if name == "combine":
            d = ep.dispatch(x, idx)
        launches, host, names = _per_call(ctx, fn)
        rows.append(("moe 128 tok DeepSeek-V3", name, launches, host, names))
    ctx.barrier()
    ep.close()
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--node-size", type=int, default=1)
    a = p.parse_args()
    pool = pool_in_nodes(a.world, a.node_size, backend="cuda", heap_size=4 << 30,
                         timeout=60.0, run_timeout=300.0)
    try:
        rows = pool.run(run)[0]
    finally:
        pool.close()
    print(f"{a.world // a.node_size} nodes x {a.node_size}: CUDA activities and host us per warm call (rank 0)")
    for op, name, launches, host, names in rows:
        print(f"{op:26s} {name:13s} launches {launches:5.1f}  host {host:7.1f} us  {names}")


if __name__ == "__main__":
    main()
