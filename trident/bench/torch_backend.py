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
   wall time per call while queueing, then a sync (rows "eager ... heap": ns, total_ns).
2. Device time per call, the project's three ways (trident/bench/common.py time_modes,
   rows "modes ..."): eager_us (calls queued back to back, device time / calls), graph_us
   (the same calls captured in one CUDA graph and replayed; GPUs only: on the CPU
   emulation the column is absent and the JSON's "graph" says why), host_us (Python time
   per call while queueing), each the max over ranks, for
     ctx.all_reduce          heap and plain tensor
     dist.all_reduce         through backend "trident", heap and plain tensor
     dist.all_reduce nccl    NCCL's, on the plain tensor, in the same run (only where each
                             rank has its own GPU: elsewhere the row is skipped, and its
                             note and the JSON's "nccl_baseline" say why)
3. A TP MLP step (ColwiseParallel up, RowwiseParallel down, forward and backward) over a
   DeviceMesh of the trident group and over one of the baseline group in the same
   processes (NCCL with one GPU per rank; gloo where ranks share a GPU, or on the CPU,
   which checks correctness only: gloo is not a speed baseline), outputs compared. The
   trident row also counts, per timed step, the plans trident built (a new address of a
   plain tensor builds one: trident/runtime/plans.py tensor_key) and the calls that fell back to
   the inner group (docs/torch-backend.md, "TP MLP step").

`--json PATH` writes common.write_results' document: the date, device, torch/triton/NCCL
versions (common.metadata), "marked" (cpu-emulation, shared GPU), and "rows".

Where ranks share a GPU (MPS; trident/runtime/placement.py), kernel times are not NVLink times:
the figures there are host time and correctness.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

CALLS, BATCH = 20000, 50
SUITE = "torch_backend"
NUMEL = 256                      # the all_reduce of the host and device rows: 1 KiB fp32
NO_GRAPH = "cpu-emulation: no CUDA graphs, so no graph_us column"


def _host_rows(ctx, calls: int, batch: int) -> dict:
    """Part 1 (silenced): {row: ns per call (fastest batch), median} on rank 0."""
    from torch._C._distributed_c10d import AllreduceOptions

    from .host import _silence, _time
    group = dist.group.WORLD
    heap, plain = ctx.zeros(NUMEL), torch.zeros(NUMEL, device=ctx.device)
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
    t = ctx.zeros(NUMEL)
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


def _nccl_skip_reason(ctx) -> str | None:
    """Why NCCL's dist.all_reduce is not a baseline here, or None where it is."""
    from . import common
    if ctx.device.type != "cuda":
        return "cpu-emulation: no NCCL"
    return None if common.nccl_runs(ctx) else common.NO_NCCL


def _mode_rows(ctx, base, timing: dict) -> dict:
    """Part 2: time_modes' eager_us, graph_us, host_us of ctx.all_reduce, dist.all_reduce
    through trident and NCCL's dist.all_reduce (`base`, None where it cannot run), on the
    same 1 KiB fp32 tensors. On the CPU emulation graph_us is left out (NO_GRAPH)."""
    from . import common
    heap, plain = ctx.zeros(NUMEL), torch.zeros(NUMEL, device=ctx.device)
    calls = {"ctx.all_reduce heap": lambda: ctx.all_reduce(heap),
             "ctx.all_reduce plain": lambda: ctx.all_reduce(plain),
             "dist.all_reduce heap": lambda: dist.all_reduce(heap),
             "dist.all_reduce plain": lambda: dist.all_reduce(plain)}
    if base is not None:
        calls["dist.all_reduce nccl plain"] = lambda: dist.all_reduce(plain, group=base)
    out = {}
    for name, fn in calls.items():
        out[f"modes {name}"] = common.time_modes(ctx, fn, **timing)
    if base is None:
        out["modes dist.all_reduce nccl plain"] = common.skipped(_nccl_skip_reason(ctx))
    for r in out.values():
        del r["synced_us"]                 # (not asked for: time_modes' synced_iters=0)
        if ctx.device.type != "cuda":
            del r["graph_us"]
    return out


def _tp_rows(ctx, shape, steps: int, base=None) -> dict:
    """Part 2: ms per TP MLP step (forward + backward) per group, outputs compared."""
    import torch.nn as nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    from ..torch.backend import inner
    tokens, dim, hidden = shape
    gpu = ctx.device.type == "cuda"
    base_name = "nccl" if gpu and inner.nccl_usable(ctx.world_size) else "gloo"
    # bf16 against NCCL; fp32 against gloo, whose CUDA path may lack bf16
    dtype = torch.bfloat16 if base_name == "nccl" else torch.float32
    if base is None or base_name != "nccl":
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
            if i == 2:
                builds, fell = ctx.plans.builds, sum(dist.group.WORLD.fallbacks.values())
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
        if name == "trident":        # what the timed steps cost trident beyond its kernels
            out["tp mlp step trident"].update(
                plan_builds_per_step=(ctx.plans.builds - builds) / steps,
                fallbacks_per_step=(sum(dist.group.WORLD.fallbacks.values()) - fell) / steps)
    ref = outputs[base_name]
    err = (outputs["trident"] - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)
    out["tp mlp output rel err (trident vs " + base_name + ")"] = dict(value=err)
    return out


def timing(gpu: bool) -> dict:
    """time_modes' options: common.CALLS calls per batch, 5 batches on GPUs; 2 calls, one
    batch on the CPU emulation (where each call interprets its kernel)."""
    from . import common
    return dict(calls=common.CALLS, reps=5, warmup=3) if gpu else dict(calls=2, reps=1,
                                                                       warmup=1)


def measure(ctx, calls: int, batch: int, shape, steps: int, modes: dict | None = None) -> dict:
    """Run on every rank (the default group being backend "trident"); rank 0's rows.
    modes: time_modes' options of the device rows (default `timing`)."""
    gpu = ctx.device.type == "cuda"
    base = dist.new_group(backend="nccl") if _nccl_skip_reason(ctx) is None else None
    rows = _host_rows(ctx, calls, batch)
    if gpu:
        rows.update(_eager_rows(ctx, max(200, calls // 20)))
    rows.update(_mode_rows(ctx, base, modes or timing(gpu)))
    rows.update(_tp_rows(ctx, shape, steps, base))
    return rows


def run(ctx, calls: int, batch: int, shape, steps: int, path: str | None = None,
        modes: dict | None = None) -> dict:
    """`measure`, then (path given) its JSON written by common.write_results on rank 0:
    metadata (date, device, versions), "marked", what the rows are, and the rows."""
    from . import common
    rows = measure(ctx, calls, batch, shape, steps, modes)
    if path:
        nccl = _nccl_skip_reason(ctx)
        extra = {"baselines": "host and modes rows: ctx.all_reduce (trident's own call) and, "
                              "where each rank has its own GPU, NCCL's dist.all_reduce; TP "
                              "MLP step: NCCL (gloo on the CPU or a shared GPU: correctness "
                              "only); all in this run",
                 "columns": {"ns": "host ns per call, kernels silenced (fastest batch)",
                             "eager_us": "device time per call of calls queued back to back",
                             "graph_us": "device time per call replayed from one CUDA graph",
                             "host_us": "Python time per call while queueing (eager)"},
                 "nccl_baseline": nccl or "dist.all_reduce on an NCCL group of the same ranks",
                 "tensor": f"{NUMEL} float32 ({NUMEL * 4} B)"}
        if ctx.device.type != "cuda":
            extra["graph"] = NO_GRAPH
        common.write_results(ctx, SUITE, rows, extra, path=path)
    return rows



def summary(rows: dict) -> str:
    """The table, then the deltas the target is about."""
    lines = [f"{name:48s} " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                         for k, v in r.items() if v is not None)
             for name, r in rows.items()]
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
    for mode in ("eager_us", "graph_us", "host_us"):
        got = {n: rows.get(f"modes {n}", {}).get(mode) for n in
               ("ctx.all_reduce heap", "dist.all_reduce heap", "dist.all_reduce plain",
                "dist.all_reduce nccl plain")}
        if any(v is not None for v in got.values()):
            lines.append(f"{mode}: " + ", ".join(f"{n} {'-' if v is None else f'{v:.2f}'}"
                                                  for n, v in got.items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    from ..runtime.launch import RankPool, default_backend
    p = argparse.ArgumentParser(prog="python -m trident.bench.torch_backend", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--calls", type=int, default=CALLS, help="timed calls per host row")
    p.add_argument("--batch", type=int, default=BATCH, help="calls per timed batch")
    p.add_argument("--steps", type=int, default=None, help="timed TP steps (default 20 on "
                   "GPUs, 3 on the CPU)")
    p.add_argument("--shape", default=None, help="TP MLP tokens,dim,hidden (default "
                   "16,4096,14336 on GPUs: Llama-3-8B's MLP; 4,16,32 on the CPU)")
    p.add_argument("--json", help="write the results (metadata and rows) here")
    args = p.parse_args(argv)
    gpu = default_backend() == "cuda"
    shape = tuple(int(v) for v in args.shape.split(",")) if args.shape else \
        ((16, 4096, 14336) if gpu else (4, 16, 32))
    steps = args.steps or (20 if gpu else 3)
    with RankPool(args.world, heap_size=(1 << 30) if gpu else (64 << 20), timeout=60.0,
                  dist_backend="trident") as pool:
        rows = pool.run(run, args.calls, args.batch, shape, steps, args.json)[0]
        if pool.mps_note:
            print(pool.mps_note)
    print(f"world {args.world}, {'GPU' if gpu else 'CPU emulation'}, torch {torch.__version__}")
    print(summary(rows))
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
