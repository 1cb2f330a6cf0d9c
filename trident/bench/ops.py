"""`trident bench ops`: GEMMs fused with communication -- every schedule of the fused ops
against NCCL + cuBLAS and torch async-TP, in one run, checked and timed.

For each op, each layer of a real model at tensor parallelism = the world size (default:
Llama-3-8B and Llama-3-70B at 2 ranks, Llama-3-70B at 4 and 8; --layers picks others:
Mixtral 8x22B, Qwen2.5-72B) and each total M (tokens; default 1, 16, 64, 256, 1024, 4096,
8192), the rows are:
  trident_<schedule>  each schedule the registry offers for the op at run time
                  (trident/ops/schedules.py: fused, sequential, epilogue, pipelined, ...;
                  "plain" is the baseline row below)
  trident_epilogue_lamport  the row-parallel ops' epilogue with exchange="lamport"
                  (ops/epilogue_lamport.py), where its buffers hold the call
  trident_fused[<core>]  with --cores (e.g. tma,gluon): the fused schedule on that GEMM
                  core (gemm=<core>; choice: the core and tiles it ran, "tma" where
                  "gluon" fell back), beside trident_fused on the default (TRIDENT_GEMM)
  trident_auto    schedule="auto", and its choice (eager / graph): the schedules of the
                  plans its timed calls ran (auto.choose's pick), printed in the table
  plain           NCCL (torch.distributed) + cuBLAS (torch.matmul): the baseline
  torch_symm_mem  torch async-TP: torch.ops.symm_mem.fused_all_gather_matmul /
                  fused_matmul_reduce_scatter on the group's symmetric memory (no
                  all-reduce counterpart; never the multimem variants); where torch lacks
                  them, on the CPU or where they fail, a row with the reason (note). The
                  torch call of the "async_tp" schedule, alone: its trident_async_tp row
                  is the same call through trident's op (plan, bias, out); the targets
                  compare auto with this baseline, not with that row
A schedule that cannot run here (schedules.unavailable: plain's NCCL, async_tp's GPUs and
torch ops) gives its row "not run" with the reason. matmul_all_reduce_add_rmsnorm (the
all-reduce, then the residual add and RMSNorm) has rows of its own, beside cuBLAS + NCCL +
torch and cuBLAS + trident's all_reduce_add_rmsnorm: ops_norm.py.
Layers: column-parallel ones (qkv, gate/up) run all_gather_matmul; row-parallel ones
(attention-out, down) run matmul_reduce_scatter and matmul_all_reduce. M must divide by
the world size for the first two (M = 1 at 2 ranks runs matmul_all_reduce only).

Every implementation's output is first checked, then timed: against the plain path's
output (checked_against "plain"), or where NCCL cannot run (ranks sharing a GPU) against
torch.matmul on inputs gathered / partial products summed by trident's own collectives
("torch+trident collectives"); relative error (Frobenius) over TOLERANCE, max over ranks,
is status "wrong: ..." and the row is not timed. Times (common.time_modes, max over ranks):
  eager_us   `calls` calls back to back from Python, device time / calls
  graph_us   the same calls captured in one CUDA graph and replayed, time / calls
  host_us    Python time per call while the eager batch is queued
  *_vs_plain plain's time / this time, eager and graph (the baseline of the same run)
Beside them, per case: gemm_us (cuBLAS alone), comm_us (NCCL alone, the op's collective on
buffers of the same sizes), comm_share = comm_us / (gemm_us + comm_us): the communication's
share of the plain path (graph times; None without NCCL); floor_us = max(gemm_us,
comm_us) and vs_floor; sol_us = max(flops / 750 TFLOP/s, bytes / NVLink); gemm_only_us
(trident's GEMM core alone, trident/ops/gemm.py) against gemm_us.

Where ranks share one GPU (bench/gpu_one.sh), peers reach each other through HBM, not
NVLink: the device times are labelled "HBM (ranks share one GPU)" (column link, the JSON's
"link", the headline), they compare the schedules' kernels with each other only, and the
NCCL rows say why they did not run. On the CPU emulation (2 ranks, tiny shapes) the run
only shows that every path runs and is right.

On GPUs of their own the run ends with issue 30's targets (`targets`: auto against the
best baseline per case, auto over plain where communication is a third of the plain path
or more, epilogue over sequential at M <= 64), each miss with its figure.

--budget-s bounds the run: no case starts past it (cases go M by M, smallest first; what
is left is listed in the JSON's not_reached); JSON (date, device, torch/triton versions,
rows) under --out-dir and a PNG per op (speedup over plain against M, graph time).
--update-crossover merges the fused and plain times into trident/ops/crossover.json
(selector.py). --auto-only times auto and plain alone (a second pass after rebuilding
auto's table, bench/gpu_two.sh's fused step): suite "ops-auto", with the table it read.

    trident bench ops                                        # every GPU, default layers
    python3 -m trident.bench.ops --world-size 2 --layers llama3 --m 1,16,64,256,1024,4096,8192
    trident bench ops --ops all_gather_matmul --cores tma,gluon   # the GEMM cores fused
    trident bench ops --ops matmul_reduce_scatter,matmul_all_reduce --cores tma,gluon \
        --m 1024,4096,8192                                   # the row-parallel ones, prefill
"""
from __future__ import annotations

import math
import os
import time

import torch
import torch.distributed as dist

from ..ccl.nccl import all_gather_single, reduce_scatter_single
from ..runtime import options
from . import common, ops_norm

DTYPE = torch.bfloat16
FUSED = ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce")   # schedules.py's
OPS = FUSED + (ops_norm.NAME,)
ALL_REDUCES = ("matmul_all_reduce", ops_norm.NAME)     # any M; the product both ways
DEFAULT_M = (1, 16, 64, 256, 1024, 4096, 8192)
TOLERANCE = 3e-2        # relative Frobenius error against the reference (bf16 outputs)
SHARED_LINK = "HBM (ranks share one GPU)"

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


def default_layers(world: int) -> list[str]:
    """Llama-3-8B and -70B at TP=2, Llama-3-70B alone at TP=4 and 8."""
    return ["llama3-8b", "llama3-70b"] if world <= 2 else ["llama3-70b"]


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
        link = (w - 1) / w * m * n * DTYPE.itemsize * (2 if op in ALL_REDUCES else 1)
    return a, wt, n, k, 2.0 * m * n_full * k_full, link


def schedules_of(op: str) -> list[str]:
    """The schedules the registry offers for `op` now, the plain one (the baseline row)
    left out; ["fused"] where there is no registry."""
    try:
        from ..ops import schedules
    except ImportError:
        return ["fused"]
    return [n for n in schedules.registered(op) if n != "plain"]


def _torch_async_tp(ctx, op, a, wt):
    """(PyTorch's async-TP op for this call, None) or (None, why it cannot run here): the
    torch call of the "async_tp" schedule (trident/ops/async_tp.py) on its own, without
    trident's plan, bias or out -- the baseline."""
    from ..ops import async_tp, schedules
    why = schedules.unavailable(ctx, op, "async_tp")
    if why is not None:
        return None, why
    try:
        group = async_tp.prepare(ctx, op, a, wt)
    except Exception as exc:                        # noqa: BLE001 -- a baseline, reported
        return None, f"symm_mem rendezvous failed: {type(exc).__name__}: {str(exc)[:120]}"
    return (lambda: async_tp.torch_call(op, group, a, wt)), None


def _comm_alone(ctx, op, a, n):
    """NCCL doing only this op's communication, on buffers of the same sizes."""
    m = a.shape[0]
    if op == "all_gather_matmul":
        out = torch.empty(m * ctx.world_size, a.shape[1], dtype=DTYPE, device=ctx.device)
        return lambda: all_gather_single(out, a, group=ctx.group)
    full = torch.randn(m, n, dtype=DTYPE, device=ctx.device)
    if op in ALL_REDUCES or ctx.backend != "cuda":
        return lambda: dist.all_reduce(full, group=ctx.group)
    part = torch.empty(m // ctx.world_size, n, dtype=DTYPE, device=ctx.device)
    return lambda: reduce_scatter_single(part, full, group=ctx.group)


def _reference(ctx, op, a, wt, plain):
    """(the reference output of this rank, what it is): the plain path's where NCCL runs,
    else torch.matmul on inputs gathered (or partial products summed, in fp32) by
    trident's own collectives."""
    if op == ops_norm.NAME:
        return ops_norm.reference(ctx, a, wt)
    if plain is not None:
        return plain(), "plain"
    world = ctx.world_size
    if op == "all_gather_matmul":
        gathered = torch.empty(a.shape[0] * world, a.shape[1], dtype=a.dtype, device=a.device)
        ctx.all_gather(gathered, a.contiguous())
        return torch.matmul(gathered, wt.t()), "torch+trident collectives"
    total = ctx.all_reduce(torch.matmul(a.float(), wt.float().t()))
    if op == "matmul_reduce_scatter":
        total = total.chunk(world)[ctx.rank]
    return total, "torch+trident collectives"


def _checked(ctx, fn, ref) -> tuple[str, float | None]:
    """(status, relative error) of fn()'s output against `ref`, the max over ranks (every
    rank must agree on whether to time it): "ok", "wrong: ..." or "error: ..."."""
    why = ""
    try:
        out = fn()
        diff = (out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-6)
        err = float(diff) if torch.isfinite(diff) else float("inf")
    except Exception as exc:                        # noqa: BLE001 -- reported in the row
        err, why = float("inf"), f"{type(exc).__name__}: {str(exc)[:120]}"
    worst = common.max_over_ranks(ctx, err)
    if worst <= TOLERANCE:
        return "ok", worst
    if why:
        return f"error: {why}", None
    if worst == float("inf"):
        return "error: an exception or a non-finite output on a rank (see its log)", None
    return f"wrong: relative error {worst:.3g} against the reference", None


AUTO_ONLY = ("trident_auto", "plain")      # --auto-only: auto and its baseline (reference)


def _impls(ctx, op, a, wt, only=None, cores=()):
    """name -> (callable or None, why not) of one case's rows, the plain baseline last;
    only: these rows alone (plain stays: the reference of the check); cores: GEMM cores
    of the fused schedule to time beside its default one (--cores), rows
    trident_fused[<core>] (every fused op: "gluon" is each one's warp-specialised kernel
    where it runs, "tma" elsewhere)."""
    from ..ops import schedules
    if op == ops_norm.NAME:
        return ops_norm.impls(ctx, a, wt, only)
    fn = getattr(ctx, op)
    out = {}
    for s in schedules_of(op):
        why = schedules.unavailable(ctx, op, s)
        out[f"trident_{s}"] = ((lambda s=s: fn(a, wt, schedule=s)), None) if why is None \
            else (None, why)
    if op != "all_gather_matmul" and "trident_epilogue" in out:    # its Lamport exchange
        from ..ops import epilogue_lamport
        fits = epilogue_lamport.fits(ctx, op, a.shape[0], wt.shape[0], a.element_size())
        out["trident_epilogue_lamport"] = (
            (lambda: fn(a, wt, schedule="epilogue", exchange="lamport")), None) if fits else \
            (None, "past the Lamport buffers' capacity (M x N per rank)")
    for core in cores:
        if op in FUSED:
            out[f"trident_fused[{core}]"] = (
                (lambda c=core: fn(a, wt, schedule="fused", gemm=c)), None)
    out["trident_auto"] = (lambda: fn(a, wt, schedule="auto")), None
    out["torch_symm_mem"] = _torch_async_tp(ctx, op, a, wt)
    nccl = common.nccl_runs(ctx)
    out["plain"] = ((lambda: fn(a, wt, schedule="plain")), None) if nccl else \
        (None, common.NO_NCCL)
    return out if only is None else {k: v for k, v in out.items() if k in only or k == "plain"}


def _recover(ctx) -> None:
    """After a call that failed (its error is sticky until reset: trident/runtime/errors.py), a
    collective ctx.reset() so that the next rows run."""
    try:
        ctx.reset()
    except Exception as exc:                        # noqa: BLE001 -- later rows say more
        if ctx.rank == 0:
            print(f"\n  ctx.reset() after a failed row: {type(exc).__name__}: {exc}")


def _choice(ctx, op, a, wt, m, n, k) -> str:
    """'eager / graph': the schedules that the auto row's calls ran -- the plans its calls
    built (schedule="auto" resolved by auto.choose, ops/_common.schedule_plan) -- or, for a
    mode not run (graphs on the CPU), what auto.choose picks for it. Printed in the table."""
    from ..ops import _common, auto
    if op == ops_norm.NAME:
        return ops_norm.choice(ctx, m, n)
    return " / ".join(_common.ran(ctx, op, a, wt, "auto", graph)
                      or auto.choose(ctx, op, m, n, k, graph=graph) for graph in (False, True))


def _case(ctx, op, model, layer, n_full, k_full, m, timing, link, only=None,
          cores=()) -> list[dict]:
    """The rows of one (op, layer, M): checked, then timed, beside the same run's
    baselines (module docstring)."""
    from ..ops import gemm
    a, wt, n, k, flops, nbytes = _problem(ctx, op, n_full, k_full, m)
    impls = _impls(ctx, op, a, wt, only, cores)
    plain = impls["plain"][0]
    ref, against = _reference(ctx, op, a, wt, plain)
    gemm_in = torch.empty(m, k, dtype=DTYPE, device=ctx.device).normal_() \
        if op == "all_gather_matmul" else a
    unsynced = {**timing, "synced_iters": 0}
    alone = {"gemm_us": lambda: torch.matmul(gemm_in, wt.t()),
             "gemm_only_us": lambda: gemm.matmul(gemm_in, wt),
             "comm_us": _comm_alone(ctx, op, a, n) if plain is not None else None}
    alone = {key: None if f is None else
             common.device_us(common.time_modes_or_skip(ctx, f, **unsynced))
             for key, f in alone.items()}
    comm, gemm_us = alone["comm_us"], alone["gemm_us"]
    base = dict(op=op, model=model, layer=layer, M=m, N=n, K=k, link=link, **alone,
                comm_share=comm / (gemm_us + comm) if comm and gemm_us else None,
                floor_us=max(gemm_us or 0.0, comm or 0.0) or None,
                sol_us=max(flops / ctx.world_size / (common.BF16_TFLOPS * 1e6),
                           common.nvlink_floor_us(nbytes)),
                gemm_only_vs_cublas=common.ratio(gemm_us, alone["gemm_only_us"]),
                checked_against=against)
    rows = []
    for name, (fn, why) in impls.items():
        row = {**base, "impl": name, "choice": None}
        if fn is None:
            if ctx.rank == 0 and name == "torch_symm_mem":
                print(f"\n  {op} {model} {layer} M={m}: torch_symm_mem skipped: {why}")
            rows.append({**row, **common.skipped(why), "status": "not run"})
            continue
        status, err = _checked(ctx, fn, ref)
        if status != "ok":
            rows.append({**row, **common.skipped(status), "status": status})
            if status.startswith("error"):
                _recover(ctx)
            continue
        t = common.time_modes_or_skip(ctx, fn, **timing)
        us = common.device_us(t)
        rows.append({**row, **t, "status": "ok" if us else t.get("graph_note"),
                     "rel_err": err, "tflops": flops / us / 1e6 if us else None,
                     "vs_floor": common.ratio(base["floor_us"], us)})
    for r in rows:                       # after its calls: the plans they ran
        if r["impl"] == "trident_auto":
            r["choice"] = _choice(ctx, op, a, wt, m, n, k)
        elif r["impl"].startswith("trident_fused["):       # the core that ran, its tiles
            from ..ops import fused_tile
            r["choice"] = fused_tile.choice(ctx, op, m, n, k, gemm=r["impl"][14:-1])
    plain_row = next(r for r in rows if r["impl"] == "plain")
    for r in rows:
        r["eager_vs_plain"] = common.ratio(plain_row["eager_us"], r["eager_us"])
        r["graph_vs_plain"] = common.ratio(plain_row["graph_us"], r["graph_us"])
    return rows


def _bench(ctx, ops, ms, layer_names, timing, budget_s=None, only=None, cores=()):
    """(rows, cases not reached within budget_s)."""
    rows, missed = [], []
    names = layer_names or (default_layers(ctx.world_size) if ctx.backend == "cuda" else [])
    link = SHARED_LINK if common.shares_gpu(ctx) else \
        ("NVLink" if ctx.backend == "cuda" else "cpu-emulation")
    # M by M, smallest first: a run cut short by its budget has every op at decode sizes
    cases = [(op, layer, m) for m in sorted(ms) for op in ops
             for layer in _layers(ctx, op, names)]
    progress = common.Progress(len(cases), "ops", enabled=ctx.rank == 0)
    t0 = time.monotonic()
    for op, (model, layer, n_full, k_full), m in cases:
        progress.step(f"{op} {model} {layer} M={m}")
        late = budget_s is not None and time.monotonic() - t0 > budget_s
        if common.max_over_ranks(ctx, float(late)):          # every rank stops alike
            missed.append(dict(op=op, model=model, layer=layer, M=m, why="budget"))
            continue
        w = ctx.world_size
        if op not in ALL_REDUCES and (m % w or n_full % w) or k_full % w:
            missed.append(dict(op=op, model=model, layer=layer, M=m,
                               why=f"M, N or K not divisible by the world size {w}"))
            continue
        rows += _case(ctx, op, model, layer, n_full, k_full, m, timing, link, only, cores)
        ctx.barrier()
    return rows, missed


def _crossover_entries(ctx, rows):
    """Fused and plain times of every measured shape, eager and graph, for crossover.json."""
    from ..ops import selector
    out = []
    for r in rows:
        if r["impl"] != "trident_fused" or not r["eager_us"] or r["op"] not in FUSED:
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


def targets(rows: list[dict]) -> dict:
    """Issue 30's two-GPU targets from one run's rows (GPUs of their own; empty without
    the baselines): per mode, auto against the best of plain, torch_symm_mem and
    trident_sequential on every case (>= 0.98: misses listed with their figure); the
    geometric mean of auto over plain where communication is at least a third of the
    plain path (>= 1.3 graph, >= 1.5 eager); epilogue over sequential at M <= 64 (>= 1.1)."""
    cases: dict = {}
    for r in rows:
        cases.setdefault((r["op"], r["model"], r["layer"], r["M"]), {})[r["impl"]] = r
    out = {}
    for mode, want in (("graph", 1.3), ("eager", 1.5)):
        key = f"{mode}_us"
        misses, gains, epi = [], [], []
        for (op, model, layer, m), impls in cases.items():
            auto = (impls.get("trident_auto") or {}).get(key)
            picks = ((impls.get("trident_auto") or {}).get("choice") or "").split(" / ")
            pick = f" ({picks[mode == 'graph']})" if len(picks) == 2 else ""
            rivals = {n: impls[n].get(key) for n in ("plain", "torch_symm_mem",
                                                     "trident_sequential") if n in impls}
            rivals = {n: t for n, t in rivals.items() if t}
            if auto and rivals:
                best = min(rivals, key=rivals.get)
                if rivals[best] / auto < 0.98:
                    misses.append(f"{op} {model} {layer} M={m}: auto {auto:.1f} us{pick} vs "
                                  f"{best} {rivals[best]:.1f} ({rivals[best] / auto:.2f}x)")
            plain = (impls.get("plain") or {}).get(key)
            share = (impls.get("plain") or {}).get("comm_share")
            if auto and plain and share is not None and share >= 1 / 3 and op in FUSED:
                gains.append(plain / auto)
            ep, seq = ((impls.get(n) or {}).get(key) for n in ("trident_epilogue",
                                                               "trident_sequential"))
            if m <= 64 and ep and seq:
                epi.append((f"{op} {model} {layer} M={m}", seq / ep))
        gm = math.exp(sum(map(math.log, gains)) / len(gains)) if gains else None
        out[mode] = {"auto_vs_best_misses": misses, "comm_bound_cases": len(gains),
                     "auto_vs_plain_geomean": gm, "target": want,
                     "epilogue_vs_sequential": epi,
                     "epilogue_misses": [f"{c}: {x:.2f}x" for c, x in epi if x < 1.1],
                     **ops_norm.targets(rows, mode)}
    return out


def _print_targets(found: dict) -> None:
    for mode, t in found.items():
        gm = t["auto_vs_plain_geomean"]
        print(f"targets ({mode}): auto vs plain, geomean over {t['comm_bound_cases']} cases "
              f"with comm >= 1/3 of plain: {'-' if gm is None else f'{gm:.2f}x'} (target "
              f">= {t['target']}); auto >= 0.98x best baseline missed on "
              f"{len(t['auto_vs_best_misses'])} case(s); epilogue >= 1.1x sequential at "
              f"M <= 64 missed on {len(t['epilogue_misses'])} of "
              f"{len(t['epilogue_vs_sequential'])}; {ops_norm.NAME} <= cuBLAS + "
              f"{ops_norm.TARGET_OVER_GEMM_US:g} us at M <= 128 missed on "
              f"{len(t['norm_misses'])} of {t['norm_cases']}")
        for line in t["auto_vs_best_misses"] + t["epilogue_misses"] + t["norm_misses"]:
            print(f"  miss: {line}")


COLUMNS = ["op", "model", "layer", "M", "N", "K", "impl", "choice", "eager_us", "graph_us",
           "host_us", "eager_vs_plain", "graph_vs_plain", "gemm_us", "comm_us", "comm_share",
           "floor_us", "vs_floor", "rel_err"]
ABOUT = ("eager_us: calls queued back to back after a device barrier, device time per call; "
         "graph_us: the same calls replayed from one CUDA graph; host_us: Python time per call "
         "while queueing; all max over ranks. Rows checked before timing against "
         "checked_against (rel_err: relative Frobenius error). *_vs_plain = plain (NCCL + "
         "cuBLAS) time / time in that mode. gemm_us: cuBLAS alone, comm_us: NCCL alone, "
         "comm_share = comm_us / (gemm_us + comm_us), floor_us = the larger (graph times); "
         "gemm_only_us: trident's GEMM core alone, gemm_only_vs_cublas = gemm_us / "
         "gemm_only_us; sol_us = max(flops/750 TFLOP/s, bytes/NVLink); vs_floor and tflops "
         "from the graph time; link: what carries the peers' traffic (NVLink, or HBM where "
         "ranks share one GPU)")


def _run(ctx, ops, ms, layer_names, timing, out_dir, update, budget_s=None, auto_only=False,
         cores=()):
    if update is not None and common.shares_gpu(ctx):
        raise ValueError("--update-crossover: ranks share one GPU here, so the plain path "
                         "(NCCL) cannot run and the times say nothing about NVLink; measure "
                         "the crossover with one GPU per rank")
    # --auto-only with --cores: auto, plain and those cores' fused rows
    only = AUTO_ONLY + tuple(f"trident_fused[{c}]" for c in cores) if auto_only else None
    rows, missed = _bench(ctx, ops, ms, layer_names, timing, budget_s, only, cores)
    if ctx.rank != 0:
        return None
    if common.headline(ctx):
        print(common.headline(ctx))
    link = rows[0]["link"] if rows else None
    if link == SHARED_LINK:
        print(f"device times: {SHARED_LINK}: the schedules' kernels against each other, "
              f"not NVLink speed")
    common.print_table(rows, COLUMNS)
    for miss in missed:
        print(f"  not run: {miss['op']} {miss['model']} {miss['layer']} M={miss['M']}: "
              f"{miss['why']}")
    found = targets(rows) if link == "NVLink" and not auto_only else None
    if found:
        _print_targets(found)
    extra = {"dtype": str(DTYPE), "link": link, "columns": ABOUT, "not_reached": missed,
             "tolerance": TOLERANCE, "budget_s": budget_s, "targets": found}
    if auto_only:              # a run of its own name: docs/results.md's ops are full runs
        from ..ops import auto
        extra["schedule_table"] = auto.builtin_about()
    path = common.write_results(ctx, "ops-auto" if auto_only else "ops", rows, extra,
                                out_dir=out_dir)
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
    from ..runtime.launch import default_backend, launch
    p = common.suite_parser("trident bench ops", __doc__, OPS)
    p.add_argument("--m", default=None, help="comma-separated total M (default "
                   f"{','.join(map(str, DEFAULT_M))} on GPUs, {','.join(map(str, TINY_M))} on CPU)")
    p.add_argument("--min-m", type=int, default=0)
    p.add_argument("--max-m", type=int, default=1 << 30)
    p.add_argument("--layers", default="", help="comma-separated model names to keep "
                   "(substring; default llama3-8b,llama3-70b at 2 ranks, llama3-70b above)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no case after this many seconds (the rest: not_reached)")
    p.add_argument("--update-crossover", nargs="?", const="", default=None, metavar="PATH",
                   help="merge fused/plain times (eager and graph) into the selector's table "
                        "(default trident/ops/crossover.json, or PATH: a copy of it to bring back)")
    p.add_argument("--auto-only", action="store_true",
                   help="time only auto and NCCL + cuBLAS (e.g. after rebuilding auto's table "
                        "from a full run), and with --cores the fused rows of those cores; "
                        "written as suite 'ops-auto', not a full ops run")
    p.add_argument("--cores", default="", help="comma-separated GEMM cores of the fused "
                   "schedule to time beside its default (rows trident_fused[<core>]): "
                   "classic, tma, gluon (the fused ops' warp-specialised Gluon kernels)")
    args = p.parse_args(argv)
    cores = [c.strip() for c in args.cores.split(",") if c.strip()]
    from ..ops._common import GEMM_MODES
    bad = [c for c in cores if c not in GEMM_MODES]
    if bad:
        p.error(f"--cores: {bad} not among {GEMM_MODES}")
    backend = args.backend or default_backend()
    gpu = backend == "cuda"
    ops = common.parse_ops(p, args.ops, OPS)
    ms = [int(x) for x in args.m.split(",")] if args.m else list(DEFAULT_M if gpu else TINY_M)
    ms = [m for m in ms if args.min_m <= m <= args.max_m]
    layers = [s.strip() for s in args.layers.split(",") if s.strip()]
    world = args.world_size or common.default_world(backend)
    heap = (12 << 30) if gpu else (64 << 20)
    options.export_default("TRIDENT_HEAP_SIZE", heap)
    launch(_run, world, ops, ms, layers, common.timing_options(args, gpu, iters=0), args.out_dir,
           args.update_crossover, args.budget_s, args.auto_only, cores, backend=backend,
           heap_size=options.get("TRIDENT_HEAP_SIZE"))
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
