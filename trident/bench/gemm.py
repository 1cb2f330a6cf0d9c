"""`python -m trident.bench.gemm`: trident's GEMM core (trident/ops/gemm.py) against
torch.matmul (cuBLAS) on one GPU, for every config candidate of each shape class, and
the tuned table from the same run.

Shapes: the GEMM each rank runs in `trident bench ops` at tensor parallelism --world
(default 2): the column-parallel layers (all_gather_matmul: M x N/world x K) and the
row-parallel ones (matmul_reduce_scatter / all_reduce: M x N x K/world) of
trident/bench/ops.py, total M in --m (default 256,1024,4096,8192), plus a few large
squares. bf16, random data, out = a @ w.T with w in nn.Linear layout [N, K].

For each shape: cuBLAS, then every candidate of gemm.CANDIDATES (TMA path, host-side
descriptors), then the table's config with in-kernel descriptors ("table:kdesc", what the
host descriptors save; never chosen), each timed
with bench/common.time_modes (eager_us: calls queued back to back; graph_us: replayed
from one CUDA graph; host_us) and checked against torch.matmul first (a candidate whose
values differ is reported and not timed). vs_cublas = cuBLAS graph time / this graph
time. `table` marks the candidate that trident/ops/gemm_table.json picks now. Split-K candidates
(name ending _sk<n>) run split_k_for's number of K slices (column split_k); where that is
1 they are their base candidate's kernel and copy its row (same_as) instead of timing it
again. To time only small M: --m 256,1024 --squares ''.
--write-table PATH writes, per shape class, the candidate of the best geometric-mean
vs_cublas over that class's shapes (measured: true), keeping unmeasured classes as they
were. Prints a table and a per-class summary; writes JSON (bench/results or --out-dir).

    PYTHONPATH=. python3 -m trident.bench.gemm --out-dir $OUT --write-table $OUT/gemm_table.json
On a machine without a GPU it runs one tiny shape under the interpreter (paths only).

One GPU and no peers: time_modes takes a context; this suite makes a one-rank stand-in
(`_Solo`) over a world-1 process group, so the common helpers run unchanged.
"""
from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.distributed as dist

from . import common
from .ops import COLUMN_PARALLEL, ROW_PARALLEL

DTYPE = torch.bfloat16
DEFAULT_M = (256, 1024, 4096, 8192)
SQUARES = (4096, 8192)
TOLERANCE = 1e-2        # relative Frobenius error against torch.matmul (bf16 output)


class _Solo:
    """What bench/common's timing asks of a context, for one process on one device."""

    rank, world_size, group = 0, 1, None

    def __init__(self, device: torch.device):
        self.device = device
        self.backend = "cuda" if device.type == "cuda" else "cpu"
        if not dist.is_initialized():
            dist.init_process_group("nccl" if self.backend == "cuda" else "gloo",
                                    store=dist.HashStore(), rank=0, world_size=1)

    def barrier(self):
        pass

    def device_barrier(self):
        if self.backend == "cuda":
            torch.cuda.synchronize(self.device)

    def sync(self):
        self.device_barrier()


def shapes(world: int, ms, squares=SQUARES) -> list[tuple[str, int, int, int]]:
    """(label, M, N, K) of every benchmark GEMM, duplicates dropped."""
    out, seen = [], set()
    for m in ms:
        for model, layer, n_full, k_full in COLUMN_PARALLEL:
            out.append((f"{model} {layer} (col)", m, n_full // world, k_full))
        for model, layer, n_full, k_full in ROW_PARALLEL:
            out.append((f"{model} {layer} (row)", m, n_full, k_full // world))
    out += [(f"square {s}", s, s, s) for s in squares]
    unique = []
    for label, m, n, k in out:
        if (m, n, k) not in seen:
            seen.add((m, n, k))
            unique.append((label, m, n, k))
    return unique


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-6)).item()


def _measure(ctx, cases, candidates, timing, progress, budget_s: float) -> list[dict]:
    from ..ops import gemm
    rows = []
    t0 = time.monotonic()
    for i, (label, m, n, k) in enumerate(cases):
        if time.monotonic() - t0 > budget_s:
            print(f"\n  time budget of {budget_s:.0f} s spent: {len(cases) - i} shapes not measured")
            break
        progress.step(f"{m}x{n}x{k}")
        cls = gemm.shape_class(m, n, k)
        table_cfg = gemm.config_for(m, n, k, split_k=True)
        a = torch.randn(m, k, dtype=DTYPE, device=ctx.device)
        w = torch.randn(n, k, dtype=DTYPE, device=ctx.device)
        ref = torch.matmul(a, w.t())
        flops = 2.0 * m * n * k
        sms = gemm.num_sms(ctx.device)
        base = dict(shape=label, M=m, N=n, K=k, shape_class=cls)
        impls = [("cublas", None, lambda: torch.matmul(a, w.t()), None)]
        for name, cfg in candidates.items():
            impls.append((name, cfg, lambda cfg=cfg: gemm.matmul(a, w, config=cfg), "host"))
        # the table's config with the descriptors made in the kernel (global scratch per
        # launch): what host descriptors save (host_us, eager_us); not a table candidate
        impls.append(("table:kdesc", table_cfg,
                      lambda: gemm.matmul(a, w, config=table_cfg, desc="kernel"), "kernel"))
        cublas_us = None
        done = {}
        for name, cfg, fn, desc in impls:
            row = {**base, "impl": name, "table": cfg == table_cfg if cfg else None}
            if cfg is not None:
                row["desc"] = desc
                row["split_k"] = gemm.split_k_for(m, n, k, cfg, sms)
            basis = gemm.base_candidate(name)
            if row.get("split_k") == 1 and basis in done:
                # split_k_for gives one slice here: the same kernel as its base candidate
                rows.append({**done[basis], **row, "same_as": basis})
                continue
            try:
                err = rel_error(fn(), ref)
            except Exception as exc:            # a config that does not fit or compile
                rows.append({**row, "error": f"{type(exc).__name__}: {str(exc)[:120]}"})
                continue
            row["rel_err"] = err
            if err > TOLERANCE:
                rows.append({**row, "error": f"wrong values: relative error {err:.2e}"})
                continue
            t = common.time_modes_or_skip(ctx, fn, **timing)
            us = common.device_us(t)
            if name == "cublas":
                cublas_us = us
            rows.append({**row, **t, "tflops": flops / us / 1e6 if us else None,
                         "vs_cublas": common.ratio(cublas_us, us) if name != "cublas" else 1.0,
                         "sol_us": flops / (common.BF16_TFLOPS * 1e6)})
            done[name] = rows[-1]
        del a, w, ref
    return rows


def summarize(rows: list[dict]) -> dict:
    """class -> (best candidate, geometric-mean vs_cublas, shapes, {candidate: geomean})."""
    per: dict = {}
    for r in rows:
        if r["impl"] not in ("cublas", "table:kdesc") and r.get("vs_cublas"):
            per.setdefault(r["shape_class"], {}).setdefault(r["impl"], []).append(r["vs_cublas"])
    out = {}
    for cls, cands in per.items():
        nshapes = max(len(v) for v in cands.values())
        # a candidate must have run on every shape of its class to be chosen
        means = {c: math.exp(sum(map(math.log, v)) / len(v)) for c, v in cands.items()
                 if len(v) == nshapes}
        best = max(means, key=means.get)
        out[cls] = (best, means[best], nshapes, means)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m trident.bench.gemm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2, help="tensor parallelism of the shapes")
    p.add_argument("--m", default=",".join(map(str, DEFAULT_M)), help="comma-separated total M")
    p.add_argument("--squares", default=",".join(map(str, SQUARES)),
                   help="comma-separated sizes of square problems ('' for none)")
    p.add_argument("--candidates", default="", help="comma-separated subset of the "
                   "candidates (default: all of trident/ops/gemm.py's CANDIDATES)")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out-dir", default=None)
    p.add_argument("--budget-s", type=float, default=200.0,
                   help="stop starting new shapes after this many seconds")
    p.add_argument("--write-table", default=None, metavar="PATH",
                   help="write the measured best config per shape class as a gemm table")
    args = p.parse_args(argv)
    from ..ops import gemm

    gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    ctx = _Solo(torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu"))
    if gpu:
        ms = [int(x) for x in args.m.split(",") if x]
        squares = [int(x) for x in args.squares.split(",") if x]
        cases = shapes(args.world, ms, squares)
        candidates = dict(gemm.CANDIDATES)
        if args.candidates:
            candidates = {c: candidates[c] for c in args.candidates.split(",")}
        timing = dict(calls=args.calls, reps=args.reps, warmup=2, synced_iters=0)
    else:
        cases = [("tiny", 40, 48, 64), ("tiny odd", 33, 24, 40)]
        candidates = {"interpret": gemm.INTERPRET_CONFIG}
        timing = dict(calls=1, reps=1, warmup=0, synced_iters=0)
    t0 = time.monotonic()
    rows = _measure(ctx, cases, candidates, timing, common.Progress(len(cases), "gemm"),
                    args.budget_s)
    columns = ["M", "N", "K", "shape_class", "impl", "table", "split_k", "eager_us", "graph_us",
               "host_us", "vs_cublas", "tflops", "sol_us", "rel_err", "error"]
    common.print_table(rows, columns)
    best = summarize(rows)
    print("\nper shape class: best candidate, geometric mean of cuBLAS time / its time "
          "(graph), shapes; the table's current choice")
    for cls in sorted(best):
        name, mean, count, means = best[cls]
        current = next((r["impl"] for r in rows if r["shape_class"] == cls and r.get("table")), "-")
        print(f"  {cls:<20} {name:<22} {mean:5.3f}x  {count:2d} shapes   table now: {current}"
              f" ({means.get(current, float('nan')):.3f}x)")
    extra = {"dtype": str(DTYPE), "world_for_shapes": args.world, "seconds": time.monotonic() - t0,
             "marked": None if gpu else "cpu-emulation", "summary": {c: {"best": b[0],
             "geomean_vs_cublas": b[1], "shapes": b[2], "all": b[3]} for c, b in best.items()},
             "columns": "eager_us/graph_us/host_us: bench/common.time_modes; vs_cublas = cuBLAS "
                        "graph time / this graph time; table: the config gemm_table.json picks now"}
    path = common.write_results(ctx, "gemm", rows, extra, out_dir=args.out_dir)
    print(f"results: {path}")
    if args.write_table:
        if not gpu:
            print("--write-table: nothing measured on the CPU emulation; no table written")
        else:
            name = torch.cuda.get_device_name(ctx.device)
            date = time.strftime("%Y-%m-%d")
            choices = {cls: (b[0], {"geomean_vs_cublas": round(b[1], 3), "shapes": b[2],
                                    "device": name, "date": date})
                       for cls, b in best.items()}
            about = (f"GEMM configs per shape class (trident/ops/gemm.py: shape_class), measured "
                     f"by `python -m trident.bench.gemm --write-table` on {name}, {date} (world "
                     f"{args.world} shapes); entries with measured: false are not measured yet")
            print(f"gemm table: {gemm.write_table(args.write_table, choices, about, measured=True)}")
    print(f"done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
