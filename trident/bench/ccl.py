"""`trident bench ccl`: every collective, every size, every implementation, in one run.

For each op and each size per rank (1 KiB .. 512 MiB on GPUs), measures trident's
algorithms one by one, trident's selector ("auto", with the algorithm it chose), NCCL
through torch.distributed and PyTorch's symmetric-memory all-reduce ops where they
exist. Median of --iters runs after --warmup, max over ranks; latency and bus bandwidth
with nccl-tests' formulas, the NVLink floor beside each row. Prints a table, writes
JSON under bench/results/ and a PNG per op (bandwidth and latency against size).

Size per rank: all_reduce/broadcast the tensor, all_gather the input block,
reduce_scatter the output block, all_to_all the input. Data is bf16.

    trident bench ccl                                   # every GPU, every op and size
    trident bench ccl --ops all_reduce --max-size 1M --iters 50
"""
from __future__ import annotations

import os

import torch

from . import common

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
SCRATCH_LIMIT = 64 << 20     # push/one-shot algorithms keep 2*world*size of scratch
DTYPE = torch.bfloat16


def _parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    for suffix, mult in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if text.endswith(suffix):
            return int(float(text[:-1]) * mult)
    return int(text)


def _algbw_factor(op: str, w: int) -> tuple[int, float, float]:
    """(nccl-tests' size S as a multiple of the per-rank size, busbw factor, one-way
    NVLink bytes per GPU as a multiple of S)."""
    return {"all_reduce": (1, 2 * (w - 1) / w, 2 * (w - 1) / w),
            "all_gather": (w, (w - 1) / w, (w - 1) / w),
            "reduce_scatter": (w, (w - 1) / w, (w - 1) / w),
            "all_to_all": (1, (w - 1) / w, (w - 1) / w),
            "broadcast": (1, 1.0, 1.0)}[op]


def _buffers(ctx, op: str, numel: int):
    """(symmetric inputs/outputs, matching plain tensors for NCCL) for one op and size."""
    w = ctx.world_size
    shapes = {"all_reduce": ((numel,), None), "broadcast": ((numel,), None),
              "all_gather": ((w * numel,), (numel,)), "reduce_scatter": ((numel,), (w * numel,)),
              "all_to_all": ((numel,), (numel,))}[op]
    sym = [ctx.empty(*s, dtype=DTYPE).normal_() for s in shapes if s is not None]
    plain = [torch.empty(s, dtype=DTYPE, device=ctx.device).normal_() for s in shapes
             if s is not None]
    return sym, plain


def _call(ctx, op, bufs, **kw):
    fn = getattr(ctx, op)
    return lambda: fn(*bufs, **kw)


def _nccl(ctx, op, bufs):
    from ..ccl import nccl
    args = {"all_reduce": lambda: nccl.all_reduce(ctx, bufs[0], "sum"),
            "broadcast": lambda: nccl.broadcast(ctx, bufs[0], 0),
            "all_gather": lambda: nccl.all_gather(ctx, *bufs),
            "reduce_scatter": lambda: nccl.reduce_scatter(ctx, *bufs, "sum"),
            "all_to_all": lambda: nccl.all_to_all(ctx, *bufs, None, None)}
    return args[op]


def _torch_symm_mem(ctx, numel):
    """PyTorch's symmetric-memory all-reduces on a buffer of their own, or {} if absent.
    Never multimem ops (multicast stays off)."""
    if ctx.backend != "cuda":
        return {}, None
    try:
        import torch.distributed._symmetric_memory as symm_mem
        name = ctx.group.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(name)
        buf = symm_mem.empty(numel, dtype=DTYPE, device=ctx.device).normal_()
        symm_mem.rendezvous(buf, group=name)
    except Exception:
        return {}, None
    impls = {}
    if hasattr(torch.ops.symm_mem, "one_shot_all_reduce"):
        impls["torch_one_shot"] = lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", name)
    if hasattr(torch.ops.symm_mem, "two_shot_all_reduce_"):
        impls["torch_two_shot"] = lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", name)
    return impls, buf


def _bench(ctx, ops, sizes, warmup, iters):
    from ..ccl import ALGORITHMS, select
    w = ctx.world_size
    rows = []
    progress = common.Progress(len(ops) * len(sizes), "ccl", enabled=ctx.rank == 0)
    for op in ops:
        scale, bus, link = _algbw_factor(op, w)
        for size in sizes:
            numel = max(1, size // DTYPE.itemsize)
            sym, plain = _buffers(ctx, op, numel)
            impls = {}
            for name in ALGORITHMS[op]:
                if size <= SCRATCH_LIMIT or name in ("two_shot", "pull") or op in ("all_to_all",):
                    impls[f"trident_{name}"] = _call(ctx, op, sym, algorithm=name)
            impls["trident_auto"] = _call(ctx, op, sym)
            impls["nccl"] = _nccl(ctx, op, plain)
            extra, tbuf = _torch_symm_mem(ctx, numel) if op == "all_reduce" else ({}, None)
            impls.update(extra)
            floor = common.nvlink_floor_us(link * scale * size)
            choice = select(op, size, w)
            for name, fn in impls.items():
                us = common.time_us_or_skip(ctx, fn, warmup, iters)
                rows.append({"op": op, "bytes": size, "size": common.fmt_bytes(size), "impl": name,
                             "choice": choice if name == "trident_auto" else None,
                             "us": us, "floor_us": floor,
                             "busbw_GBps": None if not us else scale * size / us / 1e3 * bus})
            nccl_us = next(r["us"] for r in rows if r["op"] == op and r["bytes"] == size
                           and r["impl"] == "nccl")
            for r in rows:
                if r["op"] == op and r["bytes"] == size:
                    r["vs_nccl"] = None if not (r["us"] and nccl_us) else nccl_us / r["us"]
            for t in sym:
                ctx.free(t)
            del plain, tbuf, impls
            ctx.barrier()
            progress.step(f"{op} {common.fmt_bytes(size)}")
    return rows


def _run(ctx, ops, sizes, warmup, iters, out_dir):
    rows = _bench(ctx, ops, sizes, warmup, iters)
    if ctx.rank != 0:
        return None
    if ctx.backend != "cuda":
        print("cpu-emulation: these times say nothing about GPU speed")
    common.print_table(rows, ["op", "size", "impl", "choice", "us", "busbw_GBps", "floor_us",
                              "vs_nccl"])
    from ..ccl.selector import TABLE
    extra = {"dtype": str(DTYPE), "marked": "cpu-emulation" if ctx.backend != "cuda" else None,
             "selector_table": {op: {str(k): v for k, v in t.items()} for op, t in TABLE.items()},
             "formulas": "nccl-tests: algbw = S/t; busbw = algbw * (2(w-1)/w all_reduce, "
                         "(w-1)/w all_gather/reduce_scatter/all_to_all, 1 broadcast)"}
    path = common.write_results(ctx, "ccl", rows, extra, out_dir=out_dir)
    stem = path[:-len(".json")]
    for op in ops:
        mine = [r for r in rows if r["op"] == op and r["us"]]
        for key, label, logy in (("busbw_GBps", "bus bandwidth (GB/s)", False),
                                 ("us", "latency (us)", True)):
            series: dict = {}
            for r in mine:
                series.setdefault(r["impl"], []).append((r["bytes"], r[key]))
            series["nvlink floor"] = sorted({(r["bytes"], r["floor_us"] if key == "us" else
                                              common.NVLINK_GBPS) for r in mine})
            common.plot(f"{stem}-{op}-{key.split('_')[0]}.png", series, "bytes per rank", label,
                        f"{op}, {common.device_kind(ctx)}", logy=logy)
    print(f"results: {path}")
    return path


def main(argv=None) -> int:
    from ..launch import default_backend, default_world_size, launch
    p = common.suite_parser("trident bench ccl", __doc__, OPS)
    p.add_argument("--min-size", default="1K")
    p.add_argument("--max-size", default=None, help="default 512M on GPUs, 4K on the CPU emulation")
    args = p.parse_args(argv)
    backend = args.backend or default_backend()
    gpu = backend == "cuda"
    ops = common.parse_ops(p, args.ops, OPS)
    lo, hi = _parse_size(args.min_size), _parse_size(args.max_size or ("512M" if gpu else "4K"))
    sizes = [1 << k for k in range(max(lo, 2).bit_length() - 1, hi.bit_length()) if lo <= 1 << k <= hi]
    world = args.world_size or (default_world_size(backend) if gpu else 2)
    iters = args.iters or (50 if gpu else 3)
    warmup = args.warmup if args.warmup is not None else (10 if gpu else 1)
    heap = max(1 << 30, (3 * world + 4) * hi + (256 << 20)) if gpu else max(64 << 20, 16 * world * hi)
    os.environ.setdefault("TRIDENT_HEAP_SIZE", str(heap))
    launch(_run, world, ops, sizes, warmup, iters, args.out_dir, backend=backend, heap_size=heap)
    return 0
