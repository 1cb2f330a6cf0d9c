"""`trident bench ccl`: every collective, every size, every implementation, in one run.

For each op and each size per rank (1 KiB .. 512 MiB on GPUs), measures trident's
algorithms one by one, trident's selector ("auto"; `choice` = its eager / graph pick),
NCCL through torch.distributed (plain buffers, named "gloo" on the CPU emulation, and
`nccl_symm`: buffers NCCL registered as symmetric windows, so NCCL >= 2.27 runs its
symmetric kernels) and PyTorch's symmetric-memory all-reduce ops where they exist, each
three ways (common.time_modes): eager_us (calls queued back to back from Python),
graph_us (the same calls replayed from one CUDA graph), host_us (Python time per call),
plus synced_us (one call after a device barrier); a size's implementations take their
eager batches in turns (common.time_modes_interleaved), so that a drift of the host's
speed does not pick the eager table's winner. Max over ranks; bus bandwidth with
nccl-tests' formulas from the graph time, the NVLink floor and the ratio to NCCL in each
mode beside each row. Prints a table, writes JSON and a PNG per op into --out-dir
(default ./trident-results). --update-selector writes the selector's eager and graph
tables for this world size from the measured columns (bench/selection.py).

Where ranks share a GPU, NCCL cannot run: its rows say so (`note`), the ratios to it are
empty, and torch's symmetric-memory ops (which need the group's store, not NCCL) stay.

Size per rank: all_reduce/broadcast the tensor, all_gather the input block,
reduce_scatter the output block, all_to_all the input. Data is bf16.

trident's algorithms are every kernel entry of ccl/registry.py (`registry.kernels`), so the
all_gather rows time the Gluon kernel (trident_gluon, ccl/all_gather/gluon.py) beside push,
pull and push_direct; it keeps push's scratch, so like push it stops at SCRATCH_LIMIT. The
baseline runs the registry's "nccl" entry (ccl/nccl.py) on plain tensors.

    trident bench ccl                                   # every GPU, every op and size
    trident bench ccl --ops all_reduce --max-size 1M --calls 50
    trident bench ccl --max-size 64M --factor 4 --update-selector /tmp/tables.json
"""
from __future__ import annotations

import torch

from ..runtime import options
from . import common

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
SCRATCH_LIMIT = 64 << 20     # algorithms of scratch "message" keep 2*world*size of it
DTYPE = torch.bfloat16


def parse_size(text: str) -> int:
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


# the baseline's options beside its tensors: sum, root 0, even splits
_NCCL_OPTIONS = {"all_reduce": ("sum",), "broadcast": (0,), "all_gather": (),
                 "reduce_scatter": ("sum",), "all_to_all": (None, None)}


def _nccl(ctx, op, bufs):
    """The torch.distributed baseline on `bufs`: the run function of the registry's "nccl"
    algorithm of `op` (ccl/nccl.py), called directly, as the plan's step calls it."""
    from ..ccl import registry
    fn = registry.get(op, "nccl").run()
    return lambda: fn(ctx, *bufs, *_NCCL_OPTIONS[op])


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


_SYMM_POOL: dict = {}
SYMM_OPS = ("all_reduce", "all_gather", "reduce_scatter")   # NCCL's symmetric kernels


def nccl_symm_pool(ctx):
    """A CUDA memory pool whose allocations NCCL registers as symmetric windows (NCCL >=
    2.27: ncclCommWindowRegister), so that collectives on them run NCCL's symmetric
    kernels; None (with the reason in _SYMM_POOL["why"]) where torch or NCCL lacks it.
    Reached through torch: ProcessGroupNCCL.register_mem_pool(pool, symm=True) on a
    torch.cuda.MemPool of the backend's own allocator (ncclMemAlloc)."""
    if "pool" in _SYMM_POOL or not common.nccl_runs(ctx) or ctx.backend != "cuda":
        return _SYMM_POOL.get("pool")
    _SYMM_POOL["pool"] = None
    try:
        version = torch.cuda.nccl.version()
        if tuple(version[:2]) < (2, 27):
            raise RuntimeError(f"NCCL {version} < 2.27")
        backend = ctx.group._get_backend(torch.device("cuda", ctx.device.index))
        pool = torch.cuda.MemPool(backend.mem_allocator)
        backend.register_mem_pool(pool, symm=True)
        _SYMM_POOL["pool"], _SYMM_POOL["backend"] = pool, backend
        _SYMM_POOL["why"] = f"torch MemPool + register_mem_pool(symm=True), NCCL {version}"
    except Exception as exc:                      # noqa: BLE001 -- a baseline, reported
        _SYMM_POOL["why"] = f"not reachable: {type(exc).__name__}: {exc}"
    return _SYMM_POOL["pool"]


def release_symm_pool() -> None:
    """Deregister the symmetric pool from NCCL and drop it, while its communicator lives:
    a MemPool registered for NCCL windows that outlives its communicator (a module-level
    pool, freed at interpreter exit after destroy_process_group) aborts the process at
    exit. Call it once the tensors allocated in the pool are gone (its blocks are freed
    when the last one goes). Safe to call when there is no pool."""
    pool, backend = _SYMM_POOL.pop("pool", None), _SYMM_POOL.pop("backend", None)
    if pool is None:
        return
    torch.cuda.synchronize()
    deregister = getattr(backend, "deregister_mem_pool", None)
    if deregister is not None:
        deregister(pool)
    del pool


def _nccl_symm(ctx, op, plain):
    """NCCL on buffers allocated in the symmetric pool (copies of `plain`'s shapes), or
    None where the pool is not reachable."""
    pool = nccl_symm_pool(ctx)
    if pool is None:
        return None
    with torch.cuda.use_mem_pool(pool):
        bufs = [torch.empty_like(t).copy_(t) for t in plain]
    return _nccl(ctx, op, bufs)


def _impls(ctx, op, size, sym, plain, full: bool) -> dict:
    """name -> one call: trident's algorithms, NCCL, and with `full` the selector's choice
    and torch's symmetric-memory ops."""
    from ..ccl import registry
    impls = {f"trident_{a.name}": _call(ctx, op, sym, algorithm=a.name)
             for a in registry.kernels(op) if size <= SCRATCH_LIMIT or a.scratch != "message"}
    if full:
        impls["trident_auto"] = _call(ctx, op, sym)
    impls[common.baseline_name(ctx)] = _nccl(ctx, op, plain) if common.nccl_runs(ctx) else None
    if full and common.nccl_runs(ctx) and op in SYMM_OPS:
        symm = _nccl_symm(ctx, op, plain)
        if symm is not None:
            impls["nccl_symm"] = symm
    return impls


def measure(ctx, ops, sizes, timing: dict, full: bool = True):
    """Rows of every implementation at every op and size (see the module docstring)."""
    from ..ccl import select
    w = ctx.world_size
    has_nccl = common.nccl_runs(ctx)
    rows = []
    progress = common.Progress(len(ops) * len(sizes), "ccl", enabled=ctx.rank == 0)
    for op in ops:
        scale, bus, link = _algbw_factor(op, w)
        for size in sizes:
            numel = max(1, size // DTYPE.itemsize)
            sym, plain = _buffers(ctx, op, numel)
            impls = _impls(ctx, op, size, sym, plain, full)
            extra, tbuf = _torch_symm_mem(ctx, numel) if full and op == "all_reduce" else ({}, None)
            impls.update(extra)
            floor = common.nvlink_floor_us(link * scale * size)
            choice = (f"{select(op, size, w, nccl=has_nccl)} / "
                      f"{select(op, size, w, graph=True, nccl=has_nccl)}")
            case = []
            # every implementation's eager batches in turns (time_modes_interleaved)
            times = common.time_modes_interleaved(
                ctx, {name: fn for name, fn in impls.items() if fn is not None}, **timing)
            for name, fn in impls.items():
                t = common.skipped(common.NO_NCCL) if fn is None else times[name]
                device_us = common.device_us(t)
                case.append({"op": op, "bytes": size, "size": common.fmt_bytes(size), "impl": name,
                             "choice": choice if name == "trident_auto" else None, **t,
                             "floor_us": floor, "busbw_GBps": None if not device_us else
                             scale * size / device_us / 1e3 * bus})
            nccl = next(r for r in case if r["impl"] == common.baseline_name(ctx))
            for r in case:
                r["eager_vs_nccl"] = common.ratio(nccl["eager_us"], r["eager_us"])
                r["graph_vs_nccl"] = common.ratio(nccl["graph_us"], r["graph_us"])
            rows += case
            for t in sym:
                ctx.free(t)
            del plain, tbuf, impls
            ctx.barrier()
            progress.step(f"{op} {common.fmt_bytes(size)}")
    return rows


COLUMNS = ["op", "size", "impl", "choice", "eager_us", "graph_us", "host_us", "synced_us",
           "floor_us", "eager_vs_nccl", "graph_vs_nccl", "busbw_GBps"]
ABOUT = {"columns": "eager_us: calls queued back to back after a device barrier, device time "
                    "per call; graph_us: the same calls replayed from one CUDA graph; host_us: "
                    "Python time per call while queueing; synced_us: one call right after a "
                    "device barrier (median); all max over ranks. choice: the selector's eager "
                    "/ graph pick. *_vs_nccl = NCCL time / time in that mode",
         "formulas": "nccl-tests: algbw = S/t (t = graph_us, else eager_us); busbw = algbw * "
                     "(2(w-1)/w all_reduce, (w-1)/w all_gather/reduce_scatter/all_to_all, 1 "
                     "broadcast); floor_us = one-way NVLink bytes per GPU / usable NVLink rate"}


def _plots(ctx, rows, ops, stem) -> None:
    """Per op: bus bandwidth (device time) and latency eagerly and in a graph, by size."""
    for op in ops:
        mine = [r for r in rows if r["op"] == op]
        for key, label, logy in (("busbw_GBps", "bus bandwidth (GB/s), graph time", False),
                                 ("eager_us", "eager latency (us)", True),
                                 ("graph_us", "graph latency (us)", True)):
            series: dict = {}
            for r in mine:
                if r[key]:
                    series.setdefault(r["impl"], []).append((r["bytes"], r[key]))
            series["nvlink floor"] = sorted({(r["bytes"], common.NVLINK_GBPS if key == "busbw_GBps"
                                              else r["floor_us"]) for r in mine})
            common.plot(f"{stem}-{op}-{key.split('_')[0]}.png", series, "bytes per rank", label,
                        f"{op}, {common.device_kind(ctx)}", logy=logy)


def _run(ctx, ops, sizes, timing, out_dir, update):
    if update is not None and common.shares_gpu(ctx):
        raise ValueError("--update-selector: ranks share one GPU here, so the times say "
                         "nothing about NVLink and NCCL cannot run; measure the selector's "
                         "tables with one GPU per rank")
    rows = measure(ctx, ops, sizes, timing)
    release_symm_pool()        # before the communicator goes (its buffers died with measure)
    if ctx.rank != 0:
        return None
    if common.headline(ctx):
        print(common.headline(ctx))
    common.print_table(rows, COLUMNS)
    from ..ccl import selector
    in_use = selector.tables_for(ctx.world_size)
    extra = {"dtype": str(DTYPE), **ABOUT, "nccl_symm": _SYMM_POOL.get("why", "not tried"),
             "selector": {"in_use": in_use.source, **in_use.rows}}
    path = common.write_results(ctx, "ccl", rows, extra, out_dir=out_dir)
    _plots(ctx, rows, ops, path[:-len(".json")])
    print(f"results: {path}")
    if update is not None:
        from . import selection
        new = selection.entry(rows, ops, common.metadata(ctx, "ccl"), timing["calls"])
        print(f"selector tables (world size {ctx.world_size}): "
              f"{selection.merge(update or selector.TABLES_PATH, ctx.world_size, new)}")
    return path


def sizes_between(lo: int, hi: int, factor: int) -> list[int]:
    """Powers of two from lo to hi, every `factor` (a power of two) apart."""
    if factor < 2 or factor & (factor - 1):
        raise ValueError(f"--factor must be a power of two >= 2, got {factor}")
    first = max(lo, 1).bit_length() - 1 + (lo & (lo - 1) > 0)
    return [1 << k for k in range(first, hi.bit_length(), factor.bit_length() - 1) if 1 << k <= hi]


def heap_bytes(gpu: bool, world: int, hi: int) -> int:
    """Heap per rank for sizes up to `hi`: inputs, outputs and the scratch of every algorithm."""
    return max(1 << 30, (3 * world + 4) * hi + (256 << 20)) if gpu else max(64 << 20, 16 * world * hi)


def main(argv=None) -> int:
    from ..runtime.launch import default_backend, launch
    p = common.suite_parser("trident bench ccl", __doc__, OPS)
    p.add_argument("--min-size", default="1K")
    p.add_argument("--max-size", default=None, help="default 512M on GPUs, 4K on the CPU emulation")
    p.add_argument("--factor", type=int, default=2, help="size step (a power of two)")
    p.add_argument("--update-selector", nargs="?", const="", default=None, metavar="PATH",
                   help="write the selector's eager and graph tables for this world size from "
                        "this run: into trident/ccl/tables.json, or PATH (a copy of it to bring "
                        "back)")
    args = p.parse_args(argv)
    backend = args.backend or default_backend()
    gpu = backend == "cuda"
    ops = common.parse_ops(p, args.ops, OPS)
    lo, hi = parse_size(args.min_size), parse_size(args.max_size or ("512M" if gpu else "4K"))
    try:
        sizes = sizes_between(lo, hi, args.factor)
    except ValueError as exc:
        p.error(str(exc))
    world = args.world_size or common.default_world(backend)
    if args.update_selector is not None and gpu:
        import torch
        gpus = torch.cuda.device_count()
        if world > gpus:        # refused before any rank starts (_run checks it again)
            p.error(f"--update-selector: ranks share one GPU here ({world} ranks, {gpus} "
                    f"GPU(s) visible), so the times would say nothing about NVLink and NCCL "
                    f"cannot run; measure the selector's tables with one GPU per rank")
    heap = heap_bytes(gpu, world, hi)
    options.export_default("TRIDENT_HEAP_SIZE", heap)
    launch(_run, world, ops, sizes, common.timing_options(args, gpu, iters=20), args.out_dir,
           args.update_selector, backend=backend, heap_size=heap)
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
