"""`trident bench ops`: GEMMs fused with communication against NCCL + cuBLAS, in one run.

For each op and each layer of real models at tensor parallelism = world size (default 4:
Llama-3 8B and 70B attention and MLP projections, Mixtral 8x22B and Qwen2.5-72B MLPs)
and each total M (tokens), measures:
  trident_fused   trident's fused kernel
  trident_auto    what the selector picks (trident/ops/crossover.json), and its choice
                  (eager / graph)
  trident_fused_classic  the fused kernel on the classic GEMM core, only below 4096 rows
                  where the fused kernel runs the tma core (column fused_gemm: core,
                  swap-AB, tile of out, K slices; trident/ops/fused_tile.py): "auto" does
                  where the GEMM table's entry is a small-M one (swap-AB or split-K), so
                  this is the A/B of that choice
  plain           NCCL (torch.distributed) + cuBLAS (torch.matmul): the baseline
  torch_symm_mem  torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter
                  (no all-reduce counterpart; never the multimem variants)
each three ways (common.time_modes): eager_us (calls back to back from Python), graph_us
(replayed from one CUDA graph), host_us (Python time per call), plus synced_us (one call
after a device barrier). Beside them the floor = max(GEMM alone (cuBLAS), communication
alone (NCCL)), both measured in the same run (graph time), plus the speed-of-light floor
(and gemm_only: trident's GEMM core, trident/ops/gemm.py, on the same GEMM with no
communication, against cuBLAS's gemm_us)
from 750 TFLOP/s and NVLink. Max over ranks; bf16, no bias.
Prints a table, writes JSON under bench/results/ and a PNG per op (speedup over plain
against M, graph time). The fused kernels' GEMM core is env TRIDENT_GEMM's (classic or
tma; recorded as trident_gemm in the JSON). --update-crossover merges the measured fused/plain times, eager
and graph, into the selector's table.

    trident bench ops                                   # every GPU, all layers, M 64..16384
    trident bench ops --ops all_gather_matmul --m 1024,8192 --layers llama3-70b
    python3 -m trident.bench.ops --world-size 2 --layers llama3-70b --m 64,256,1024,4096,8192
On the CPU emulation (2 ranks, tiny shapes) it only shows that everything runs. Where
ranks share a GPU, NCCL cannot run: the plain rows say so (`note`), comm_us is empty (the
floor is the GEMM alone) and torch_symm_mem (no NCCL in it) stays.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ..ccl.nccl import all_gather_single, reduce_scatter_single
from . import common

DTYPE = torch.bfloat16
OPS = ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce")
DEFAULT_M = (64, 256, 1024, 4096, 16384)

# (model, layer, N_full, K_full) in nn.Linear terms: y = x @ W.T, W [N_full, K_full].
# Column-parallel layers (all_gather_matmul) shard N; row-parallel ones shard K.
COLUMN_PARALLEL = [
    ("llama3-8b", "qkv", 4096 + 2 * 1024, 4096),
    ("llama3-8b", "mlp_gate_up", 2 * 14336, 4096),
    ("llama3-70b", "qkv", 8192 + 2 * 1024, 8192),
    ("llama3-70b", "mlp_gate_up", 2 * 28672, 8192),
    ("mixtral-8x22b", "mlp_gate_up", 2 * 16384, 6144),
    ("qwen2.5-72b", "mlp_gate_up", 2 * 29568, 8192),
]
ROW_PARALLEL = [
    ("llama3-8b", "attn_out", 4096, 4096),
    ("llama3-8b", "mlp_down", 4096, 14336),
    ("llama3-70b", "attn_out", 8192, 8192),
    ("llama3-70b", "mlp_down", 8192, 28672),
    ("mixtral-8x22b", "mlp_down", 6144, 16384),
    ("qwen2.5-72b", "mlp_down", 8192, 29568),
]
TINY = {"column": [("tiny", "up", 96, 48)], "row": [("tiny", "down", 40, 64)]}
TINY_M = (64, 96)


def _layers(ctx, op, names):
    gpu = ctx.backend == "cuda"
    table = (COLUMN_PARALLEL if op == "all_gather_matmul" else ROW_PARALLEL) if gpu else \
        TINY["column" if op == "all_gather_matmul" else "row"]
    return [l for l in table if not names or any(n in l[0] for n in names)]


def _problem(ctx, op, n_full, k_full, m):
    """Per-rank inputs and (flops of the whole layer, one-way NVLink bytes per GPU)."""
    w = ctx.world_size
    gen = torch.Generator(device=ctx.device).manual_seed(1234 + ctx.rank)
    rnd = lambda *s: torch.randn(*s, generator=gen, device=ctx.device, dtype=DTYPE)  # noqa: E731
    if op == "all_gather_matmul":
        n, k = n_full // w, k_full
        a, wt = rnd(m // w, k), rnd(n, k)
        link = (w - 1) / w * m * k * DTYPE.itemsize
    else:
        n, k = n_full, k_full // w
        a, wt = rnd(m, k), rnd(n, k)
        link = (w - 1) / w * m * n * DTYPE.itemsize * (2 if op == "matmul_all_reduce" else 1)
    return a, wt, n, k, 2.0 * m * n_full * k_full, link


def _torch_symm_mem(ctx, op, a, wt):
    """PyTorch's fused async-TP op for this call, or None where it has none/cannot run."""
    if ctx.backend != "cuda" or op == "matmul_all_reduce":
        return None
    try:
        from torch.distributed import _symmetric_memory as symm_mem
        name = ctx.group.group_name
        try:
            symm_mem.enable_symm_mem_for_group(name)
        except Exception:
            pass
        if op == "all_gather_matmul":
            return lambda: torch.ops.symm_mem.fused_all_gather_matmul(
                a, [wt.t()], 0, name, return_A=True)   # return_A: never the multimem path
        return lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, wt.t(), "sum", 0, name)
    except Exception:
        return None


def _comm_alone(ctx, op, a, n):
    """NCCL doing only this op's communication, on buffers of the same sizes."""
    m = a.shape[0]
    if op == "all_gather_matmul":
        out = torch.empty(m * ctx.world_size, a.shape[1], dtype=DTYPE, device=ctx.device)
        return lambda: all_gather_single(out, a, group=ctx.group)
    full = torch.randn(m, n, dtype=DTYPE, device=ctx.device)
    if op == "matmul_all_reduce":
        return lambda: dist.all_reduce(full, group=ctx.group)
    if ctx.backend != "cuda":
        return lambda: dist.all_reduce(full, group=ctx.group)
    part = torch.empty(m // ctx.world_size, n, dtype=DTYPE, device=ctx.device)
    return lambda: reduce_scatter_single(part, full, group=ctx.group)


def _bench(ctx, ops, ms, layer_names, timing):
    from ..ops import fused_tile, gemm, selector
    from ..ops._common import TMA_MIN_M
    rows = []
    cases = [(op, layer, m) for op in ops for layer in _layers(ctx, op, layer_names) for m in ms]
    progress = common.Progress(len(cases), "ops", enabled=ctx.rank == 0)
    for op, (model, layer, n_full, k_full), m in cases:
        progress.step(f"{op} {model} {layer} M={m}")
        if m % ctx.world_size or n_full % ctx.world_size or k_full % ctx.world_size:
            continue
        a, wt, n, k, flops, link = _problem(ctx, op, n_full, k_full, m)
        fn = getattr(ctx, op)
        has_nccl = common.nccl_runs(ctx)
        impls = {"trident_fused": lambda: fn(a, wt, algorithm="fused"),
                 "trident_auto": lambda: fn(a, wt),
                 "plain": (lambda: fn(a, wt, algorithm="plain")) if has_nccl else None}
        fused_gemm = fused_tile.choice(ctx, op, m, n, k)
        if not fused_gemm.startswith("classic") and m < TMA_MIN_M:
            impls["trident_fused_classic"] = lambda: fn(a, wt, algorithm="fused",
                                                        gemm="classic")
        tsm = _torch_symm_mem(ctx, op, a, wt)
        if tsm is not None:
            impls["torch_symm_mem"] = tsm
        gemm_in = torch.empty(m, k, dtype=DTYPE, device=ctx.device).normal_() \
            if op == "all_gather_matmul" else a
        alone = {"gemm_us": lambda: torch.matmul(gemm_in, wt.t()),
                 "gemm_only_us": lambda: gemm.matmul(gemm_in, wt),
                 "comm_us": _comm_alone(ctx, op, a, n) if has_nccl else None}
        unsynced = {**timing, "synced_iters": 0}
        alone = {key: None if f is None else
                 common.device_us(common.time_modes_or_skip(ctx, f, **unsynced))
                 for key, f in alone.items()}
        floor = max(alone["gemm_us"] or 0.0, alone["comm_us"] or 0.0) or None
        sol = max(flops / ctx.world_size / (common.BF16_TFLOPS * 1e6), common.nvlink_floor_us(link))
        choice = (f"{selector.select(ctx, op, m, n, k, graph=False)} / "
                  f"{selector.select(ctx, op, m, n, k, graph=True)}")
        base = dict(op=op, model=model, layer=layer, M=m, N=n, K=k, fused_gemm=fused_gemm,
                    **alone, floor_us=floor,
                    sol_us=sol, gemm_only_vs_cublas=common.ratio(alone["gemm_us"],
                                                                 alone["gemm_only_us"]))
        case_rows = []
        for name, f in impls.items():
            t = common.skipped(common.NO_NCCL) if f is None else \
                common.time_modes_or_skip(ctx, f, **timing)
            us = common.device_us(t)
            case_rows.append({**base, "impl": name, "choice": choice if name == "trident_auto"
                              else None, **t, "tflops": flops / us / 1e6 if us else None,
                              "vs_floor": common.ratio(floor, us)})
        plain = next(r for r in case_rows if r["impl"] == "plain")
        for r in case_rows:
            r["eager_vs_plain"] = common.ratio(plain["eager_us"], r["eager_us"])
            r["graph_vs_plain"] = common.ratio(plain["graph_us"], r["graph_us"])
        rows += case_rows
        del a, wt, gemm_in, impls
        ctx.barrier()
    return rows


def _crossover_entries(ctx, rows):
    """Fused and plain times of every measured shape, eager and graph, for crossover.json."""
    from ..ops import selector
    out = []
    for r in rows:
        if r["impl"] != "trident_fused" or not r["eager_us"]:
            continue
        plain = next((p for p in rows if p["impl"] == "plain" and p["op"] == r["op"] and
                      p["M"] == r["M"] and p["N"] == r["N"] and p["K"] == r["K"]), None)
        if plain and plain["eager_us"]:
            entry = {"op": r["op"], "device": selector.device_name(ctx),
                     "world_size": ctx.world_size, "M": r["M"], "N": r["N"], "K": r["K"],
                     "fused_us": round(r["eager_us"], 2), "plain_us": round(plain["eager_us"], 2)}
            if r["graph_us"] and plain["graph_us"]:
                entry.update(fused_graph_us=round(r["graph_us"], 2),
                             plain_graph_us=round(plain["graph_us"], 2))
            out.append(entry)
    return out


COLUMNS = ["op", "model", "layer", "M", "N", "K", "fused_gemm", "impl", "choice", "eager_us",
           "graph_us",
           "host_us", "synced_us", "eager_vs_plain", "graph_vs_plain", "floor_us", "vs_floor",
           "gemm_us", "gemm_only_us", "gemm_only_vs_cublas",
           "sol_us", "tflops"]
ABOUT = ("eager_us: calls queued back to back after a device barrier, device time per call; "
         "graph_us: the same calls replayed from one CUDA graph; host_us: Python time per call "
         "while queueing; synced_us: one call right after a device barrier (median); all max "
         "over ranks. floor_us = max(gemm_us: cuBLAS alone, comm_us: NCCL alone), graph time; "
         "gemm_only_us: trident's GEMM core (trident/ops/gemm.py) alone on the same GEMM, no "
         "communication, graph time; gemm_only_vs_cublas = gemm_us / gemm_only_us; "
         "fused_gemm: the GEMM of rank 0's fused kernel (core, swab = swap-AB, tile of out "
         "rows x columns x BK, K slices); "
         "sol_us = max(flops/750 TFLOP/s, bytes/NVLink); *_vs_plain = plain time / time in "
         "that mode; vs_floor and tflops from the graph time")


def _run(ctx, ops, ms, layer_names, timing, out_dir, update):
    if update is not None and common.shares_gpu(ctx):
        raise ValueError("--update-crossover: ranks share one GPU here, so the plain path "
                         "(NCCL) cannot run and the times say nothing about NVLink; measure "
                         "the crossover with one GPU per rank")
    rows = _bench(ctx, ops, ms, layer_names, timing)
    if ctx.rank != 0:
        return None
    if common.headline(ctx):
        print(common.headline(ctx))
    common.print_table(rows, COLUMNS)
    from ..ops._common import GEMM_MODE
    print(f"fused GEMM core: {GEMM_MODE} (env TRIDENT_GEMM)")
    extra = {"dtype": str(DTYPE), "trident_gemm": GEMM_MODE, "columns": ABOUT}
    path = common.write_results(ctx, "ops", rows, extra, out_dir=out_dir)
    stem = path[:-len(".json")]
    for op in ops:
        series: dict = {}
        for r in rows:
            if r["op"] == op and r["graph_vs_plain"] and r["impl"] != "plain":
                series.setdefault(f"{r['impl']} {r['model']} {r['layer']}", []).append(
                    (r["M"], r["graph_vs_plain"]))
        if series:
            common.plot(f"{stem}-{op}.png", series, "M (tokens, total)",
                        "speedup over NCCL + cuBLAS (graph time)",
                        f"{op}, {common.device_kind(ctx)}")
    if update is not None and ctx.backend == "cuda":
        from ..ops import selector
        path_t = update or selector.TABLE_PATH
        if update and not os.path.exists(update) and os.path.exists(selector.TABLE_PATH):
            import shutil
            shutil.copy(selector.TABLE_PATH, update)
        print(f"crossover table: {selector.update_table(_crossover_entries(ctx, rows), path_t)}")
    print(f"results: {path}")
    return path


def main(argv=None) -> int:
    from ..launch import default_backend, launch
    p = common.suite_parser("trident bench ops", __doc__, OPS)
    p.add_argument("--m", default=None, help="comma-separated total M (default "
                   f"{','.join(map(str, DEFAULT_M))} on GPUs, {','.join(map(str, TINY_M))} on CPU)")
    p.add_argument("--min-m", type=int, default=0)
    p.add_argument("--max-m", type=int, default=1 << 30)
    p.add_argument("--layers", default="", help="comma-separated model names to keep (substring)")
    p.add_argument("--update-crossover", nargs="?", const="", default=None, metavar="PATH",
                   help="merge fused/plain times (eager and graph) into the selector's table "
                        "(default trident/ops/crossover.json, or PATH: a copy of it to bring back)")
    args = p.parse_args(argv)
    backend = args.backend or default_backend()
    gpu = backend == "cuda"
    ops = common.parse_ops(p, args.ops, OPS)
    ms = [int(x) for x in args.m.split(",")] if args.m else list(DEFAULT_M if gpu else TINY_M)
    ms = [m for m in ms if args.min_m <= m <= args.max_m]
    layers = [s.strip() for s in args.layers.split(",") if s.strip()]
    world = args.world_size or common.default_world(backend)
    heap = (6 << 30) if gpu else (64 << 20)
    os.environ.setdefault("TRIDENT_HEAP_SIZE", str(heap))
    launch(_run, world, ops, ms, layers, common.timing_options(args, gpu, iters=10), args.out_dir,
           args.update_crossover, backend=backend, heap_size=heap)
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
