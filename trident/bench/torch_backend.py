"""Host cost of torch.distributed backend "trident", and a tensor-parallel MLP step over it
(`python -m trident.bench.torch_backend`).

1. Host time per warm call (target: `dist.all_reduce` at most 2 us above `ctx.all_reduce`
   on the same tensor). The plans are built for real, then every plan step is silenced
   (trident/bench/host.py: the kernel launch and staging copies become no-ops), and rank 0
   alone times, in batches, fastest batch:
     ctx.all_reduce(t)          trident's own call
     group.allreduce([t], o)    + the backend's layer (what torch's dispatch calls)
     dist.all_reduce(t)         + torch.distributed's Python wrapper, which every backend
                                  pays (NCCL too); with op=ReduceOp(ReduceOp.SUM) (an
                                  object, not the enum) the wrapper skips a conversion
   on a heap tensor and a plain one. The launch left out is the same C call in all rows.
   On GPUs it also times the real thing: `calls` back-to-back calls on every rank, host
   wall time per call while queueing, then a sync (rows "eager").
2. A TP MLP step (ColwiseParallel up, RowwiseParallel down, forward and backward) over a
   DeviceMesh of the trident group and over one of the baseline group in the same
   processes (NCCL with one GPU per rank; gloo where ranks share a GPU, or on the CPU,
   which checks correctness only: gloo is not a speed baseline), outputs compared.

Where ranks share a GPU (MPS; trident/placement.py), kernel times are not NVLink times:
the figures there are host time and correctness.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

CALLS, BATCH = 20000, 50


def _host_rows(ctx, calls: int, batch: int) -> dict:
    """Part 1 (silenced): {row: ns per call (fastest batch), median} on rank 0."""
    from torch._C._distributed_c10d import AllreduceOptions

    from .host import _silence, _time
    group = dist.group.WORLD
    heap, plain = ctx.zeros(256), torch.zeros(256, device=ctx.device)     # 1 KiB fp32
    opts = AllreduceOptions()
    opts.asyncOp = False
    rows = {}
    for name, t in (("heap", heap), ("plain", plain)):
        rows[f"ctx.all_reduce {name}"] = lambda t=t: ctx.all_reduce(t)
        rows[f"group.allreduce {name}"] = lambda t=t: group.allreduce([t], opts)
        rows[f"dist.all_reduce {name}"] = lambda t=t: dist.all_reduce(t)
    rows["dist.all_reduce heap async_op"] = lambda: dist.all_reduce(heap, async_op=True).wait()
    # torch's wrapper converts the default op (an enum) to a ReduceOp: ~0.4 us of pybind
    # that a caller passing a ReduceOp object does not pay (any backend)
    sum_op = dist.ReduceOp(dist.ReduceOp.SUM)
    rows["dist.all_reduce heap op=ReduceOp(SUM)"] = lambda: dist.all_reduce(heap, op=sum_op)
    for fn in rows.values():       # build every plan, run the kernels once for real
        fn()
    ctx.barrier()
    out = {}
    undo = _silence(ctx)
    try:
        if ctx.rank == 0:
            for name, fn in rows.items():
                ts = _time(fn, calls, batch)
                out[name] = dict(ns=min(ts), median_ns=statistics.median(ts))
        dist.barrier(group=ctx.group)
    finally:
        undo()
    ctx.barrier()
    return out


def _eager_rows(ctx, calls: int) -> dict:
    """GPUs: host wall time per call of `calls` real calls back to back, every rank."""
    t = ctx.zeros(256)
    out = {}
    for name, fn in (("ctx.all_reduce", lambda: ctx.all_reduce(t)),
                     ("dist.all_reduce", lambda: dist.all_reduce(t))):
        fn()
        ctx.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host = time.perf_counter() - t0
        torch.cuda.synchronize()
        out[f"eager {name} heap"] = dict(ns=host / calls * 1e9,
                                         total_ns=(time.perf_counter() - t0) / calls * 1e9)
        ctx.barrier()
    return out


def _tp_rows(ctx, shape, steps: int) -> dict:
    """Part 2: ms per TP MLP step (forward + backward) per group, outputs compared."""
    import torch.nn as nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    from ..torch_backend import inner
    tokens, dim, hidden = shape
    gpu = ctx.device.type == "cuda"
    base_name = "nccl" if gpu and inner.nccl_usable(ctx.world_size) else "gloo"
    # bf16 against NCCL; fp32 against gloo, whose CUDA path may lack bf16
    dtype = torch.bfloat16 if base_name == "nccl" else torch.float32
    base = dist.new_group(backend=base_name)
    meshes = {"trident": DeviceMesh.from_group(dist.group.WORLD, ctx.device.type),
              base_name: DeviceMesh.from_group(base, ctx.device.type)}
    x = torch.randn(tokens, dim, generator=torch.Generator().manual_seed(1)).to(ctx.device, dtype)
    out, outputs = {}, {}
    for name, mesh in meshes.items():
        torch.manual_seed(0)            # the same weights on every rank and for each group
        with torch.device(ctx.device):  # made where they run (GPU init of large layers)
            model = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim))
        model = model.to(dtype)
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        times = []
        for i in range(steps + 2):          # two warm-up steps
            if gpu:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            y = model(x)
            y.float().sum().backward()
            if gpu:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            if i == 0:
                outputs[name] = y.detach().float().cpu()
        out[f"tp mlp step {name}"] = dict(ms=statistics.median(times[2:]) * 1e3,
                                          shape=f"{tokens}x{dim}->{hidden}, {dtype}")
    ref = outputs[base_name]
    err = (outputs["trident"] - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)
    out["tp mlp output rel err (trident vs " + base_name + ")"] = dict(value=err)
    return out


def measure(ctx, calls: int, batch: int, shape, steps: int) -> dict:
    """Run on every rank (the default group being backend "trident"); rank 0's rows."""
    rows = _host_rows(ctx, calls, batch)
    if ctx.device.type == "cuda":
        rows.update(_eager_rows(ctx, max(200, calls // 20)))
    rows.update(_tp_rows(ctx, shape, steps))
    return rows


def summary(rows: dict) -> str:
    """The table, then the deltas the target is about."""
    lines = [f"{name:48s} " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                         for k, v in r.items()) for name, r in rows.items()]
    for kind in ("heap", "plain"):
        c, g, d = (rows.get(f"{op} {kind}", {}).get("ns") for op in
                   ("ctx.all_reduce", "group.allreduce", "dist.all_reduce"))
        if None not in (c, g, d):
            lines.append(f"{kind}: dist.all_reduce - ctx.all_reduce = {(d - c) / 1e3:.2f} us "
                         f"(target <= 2): the backend's layer {(g - c) / 1e3:.2f} us, "
                         f"torch.distributed's wrapper {(d - g) / 1e3:.2f} us")
    c, o = (rows.get(name, {}).get("ns") for name in
            ("ctx.all_reduce heap", "dist.all_reduce heap op=ReduceOp(SUM)"))
    if None not in (c, o):
        lines.append(f"heap, op=ReduceOp(ReduceOp.SUM): dist.all_reduce - ctx.all_reduce = "
                     f"{(o - c) / 1e3:.2f} us")
    return "\n".join(lines)


def main(argv=None) -> int:
    from ..launch import RankPool, default_backend
    p = argparse.ArgumentParser(prog="python -m trident.bench.torch_backend", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--calls", type=int, default=CALLS, help="timed calls per host row")
    p.add_argument("--batch", type=int, default=BATCH, help="calls per timed batch")
    p.add_argument("--steps", type=int, default=None, help="timed TP steps (default 20 on "
                   "GPUs, 3 on the CPU)")
    p.add_argument("--shape", default=None, help="TP MLP tokens,dim,hidden (default "
                   "16,4096,14336 on GPUs: Llama-3-8B's MLP; 4,16,32 on the CPU)")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    gpu = default_backend() == "cuda"
    shape = tuple(int(v) for v in args.shape.split(",")) if args.shape else \
        ((16, 4096, 14336) if gpu else (4, 16, 32))
    steps = args.steps or (20 if gpu else 3)
    with RankPool(args.world, heap_size=(1 << 30) if gpu else (64 << 20), timeout=60.0,
                  dist_backend="trident") as pool:
        rows = pool.run(measure, args.calls, args.batch, shape, steps)[0]
        if pool.mps_note:
            print(pool.mps_note)
    print(f"world {args.world}, {'GPU' if gpu else 'CPU emulation'}, torch {torch.__version__}")
    print(summary(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
