"""docs/results.md, the README's result tables and bench/results/README.md, generated from
the committed run files in bench/results/, so that no figure is typed by hand.

    python bench/make_results.py            # rewrite the three from bench/results/*.json
    python bench/make_results.py --check    # exit 1 if a committed one differs (tests do this)

For each family of `trident bench` (ccl, ops, moe, gemm, p2p, tp), docs/results.md holds the
latest run of each device kind (the JSON's "device", plus its "nodes" across nodes), with
its date, device, versions and file, trident beside the baseline of the same run, eager and
graph. The README's compact table of a family comes from that family's latest run on GPUs of
their own (not shared, not across nodes); it sits between `<!-- results:FAMILY -->` and
`<!-- /results:FAMILY -->` and is rewritten in place (the ops table ends with which schedule
was fastest where, over the run's layers). bench/results/README.md lists every
file of bench/results/ with what it is.

Cells "a · b · c" are eager · graph · host in microseconds (bench/common.py: eager = calls
queued back to back, device time per call; graph = the same calls replayed from one CUDA
graph; host = Python time per call; all max over ranks). "x×" = baseline time / trident
time in the same mode (above 1: trident is faster).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
DOC = os.path.join(ROOT, "docs", "results.md")
README = os.path.join(ROOT, "README.md")
INDEX = os.path.join(RESULTS, "README.md")
FAMILIES = ("ccl", "ops", "moe", "gemm", "p2p", "tp")
TITLES = {"ccl": "Collectives (`trident bench ccl`)",
          "ops": "GEMM fused with communication (`trident bench ops`)",
          "moe": "MoE dispatch + combine (`trident bench moe`)",
          "gemm": "The GEMM core alone (`trident bench gemm`)",
          "p2p": "Point to point (`trident bench p2p`)",
          "tp": "Tensor-parallel decode step (`trident bench tp`)"}
DASH = "–"


# ---------------------------------------------------------------- loading and choosing runs

def load_runs(folder: str = RESULTS) -> list[dict]:
    """Every result JSON of a bench family in `folder` (a dict with "suite" and "rows"),
    with its file name under "_file"."""
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            doc = json.load(f)
        if isinstance(doc, dict) and doc.get("suite") in FAMILIES and doc.get("rows"):
            runs.append({**doc, "_file": os.path.basename(path)})
    return runs


def kind(run: dict) -> str:
    """A run's device kind: its device, and its node layout across nodes."""
    return run["device"] + (f", nodes {run['nodes']}" if run.get("nodes") else "")


def _ops(run: dict) -> frozenset:
    return frozenset(row.get("op") for row in run["rows"])


def _ms(run: dict) -> frozenset:
    return frozenset(row["M"] for row in run["rows"] if row.get("M") is not None)


def part(run: dict, runs: list[dict]) -> str:
    """"" for a run of every op (and every M, for the GEMM core's runs) its family's runs
    on GPUs of their own have; else the ops or Ms it ran (a run of a subset, e.g. `--ops
    all_reduce` or `--m 64,128`): it is listed beside the whole runs, never replaces one,
    and never heads the README."""
    # the ops and Ms of the family's runs on GPUs of their own (a run where ranks share
    # one GPU may cover a newer op: that does not make the last whole run a subset)
    family = [r for r in runs if r["suite"] == run["suite"]]
    family = [r for r in family if not r.get("marked")] or family
    every = frozenset().union(*(_ops(r) for r in family))
    mine = _ops(run)
    if not mine >= every:
        return ", ".join(sorted(o for o in mine if o))
    if run["suite"] != "gemm":
        return ""
    every_m, my_m = frozenset().union(*(_ms(r) for r in family)), _ms(run)
    return "" if my_m >= every_m else "M " + ", ".join(str(m) for m in sorted(my_m))


def latest(runs: list[dict], family: str) -> list[dict]:
    """The newest run of `family` per device kind (and per subset of ops, for runs of a
    subset: `part`, when newer than the kind's whole run), by world size then device."""
    best: dict[tuple, dict] = {}
    for r in runs:
        key = (kind(r), part(r, runs))
        if r["suite"] == family and (key not in best or r["date"] > best[key]["date"]):
            best[key] = r
    # a run of a subset is shown only when it is newer than the whole run of its kind
    best = {k: r for k, r in best.items()
            if not k[1] or (k[0], "") not in best or r["date"] > best[(k[0], "")]["date"]}
    return sorted(best.values(), key=lambda r: (r.get("world_size", 0), kind(r),
                                                part(r, runs)))


def headline_run(runs: list[dict], family: str) -> dict | None:
    """The newest run of `family` on GPUs of their own (not marked, not across nodes) that
    ran every op of the family."""
    own = [r for r in latest(runs, family) if not r.get("marked") and not r.get("nodes")
           and r.get("backend", "cuda") == "cuda" and not part(r, runs)]
    return max(own, key=lambda r: r["date"]) if own else None


# ---------------------------------------------------------------- formatting

def us(v) -> str:
    if v is None:
        return DASH
    return f"{v:.2f}" if v < 1 else f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def rate(v) -> str:
    return DASH if not v else f"{v:.1f}" if v < 10 else f"{v:.0f}"


def cells(r: dict | None, keys=("eager_us", "graph_us", "host_us")) -> str:
    return DASH if r is None else " · ".join(us(r.get(k)) for k in keys)


def times(base, mine) -> str:
    return f"{base / mine:.2f}×" if base and mine else DASH


def speedups(base: dict | None, mine: dict | None) -> str:
    if base is None or mine is None:
        return DASH
    return " · ".join(times(base.get(k), mine.get(k)) for k in ("eager_us", "graph_us"))


def table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def setup(run: dict, link_prefix: str, where: bool = True) -> str:
    """One line: (with `where`) date and device, then world size, versions, the file and
    what the figures are not."""
    parts = [run["date"][:10], kind(run)] if where else []
    parts.append(f"world size {run.get('world_size', '?')}")
    if run.get("dtype"):
        parts.append(str(run["dtype"]).replace("torch.", ""))
    parts.append(f"torch {run.get('torch', '?')}, triton {run.get('triton', '?')}"
                 + (f", NCCL {run['nccl']}" if run.get("nccl") else ""))
    if run.get("trident_gemm"):
        parts.append(f"TRIDENT_GEMM={run['trident_gemm']}")
    line = " · ".join(parts) + f" · [{run['_file']}]({link_prefix}{run['_file']})"
    if run.get("marked"):
        line += f" · **{run['marked']}**"
    return line


def _by(rows, *keys):
    """Rows grouped by `keys`, in first-seen order: {(values): {impl: row}}."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in keys), {})[r.get("impl")] = r
    return groups


# ---------------------------------------------------------------- one family each

def _ccl_baseline(impls: dict) -> tuple[str, dict | None]:
    for name in ("nccl", "gloo"):
        if name in impls:
            return name, impls[name]
    return "nccl", None


def ccl_full(run: dict) -> list[str]:
    rows = []
    has_symm = any(r["impl"] == "nccl_symm" for r in run["rows"])
    for (op, size, _), impls in _by(run["rows"], "op", "size", "bytes").items():
        auto = impls.get("trident_auto")
        name, base = _ccl_baseline(impls)
        algos = [(r.get("graph_us") or r.get("eager_us"), n[len("trident_"):])
                 for n, r in impls.items() if n.startswith("trident_") and n != "trident_auto"
                 and (r.get("graph_us") or r.get("eager_us"))]
        best = min(algos) if algos else None
        bw = " / ".join(rate(x) for x in
                        ((auto or {}).get("busbw_GBps"), (base or {}).get("busbw_GBps")))
        symm = [cells(impls.get("nccl_symm"))] if has_symm else []
        rows.append([op, size, (auto or {}).get("choice") or DASH, cells(auto),
                     f"{best[1]}: {us(best[0])}" if best else DASH, cells(base), *symm,
                     speedups(base, auto), bw, us((auto or {}).get("floor_us"))])
    base_name = _ccl_baseline({r["impl"]: r for r in run["rows"]})[0]
    return table(["op", "bytes per rank", "auto's choice (eager / graph)",
                  "trident auto", "fastest trident algorithm (graph)", base_name,
                  *(["nccl_symm (NCCL's symmetric kernels)"] if has_symm else []),
                  f"auto vs {base_name} (eager · graph)", f"busbw auto / {base_name} GB/s",
                  "floor"], rows)


def ccl_compact(run: dict) -> list[str]:
    """One row per op: its smallest and its largest size, auto against the baseline."""
    rows = []
    groups = _by(run["rows"], "op", "bytes", "size")
    name = _ccl_baseline({r["impl"]: r for r in run["rows"]})[0]
    for op in dict.fromkeys(k[0] for k in groups):
        sizes = sorted(k for k in groups if k[0] == op)
        row = [op]
        for key in (sizes[0], sizes[-1]):
            base, auto = _ccl_baseline(groups[key])[1], groups[key].get("trident_auto")
            row += [key[2], cells(auto, ("eager_us", "graph_us")),
                    cells(base, ("eager_us", "graph_us")), speedups(base, auto)]
        rows.append(row)
    return table(["op", "size", "trident µs", f"{name} µs", "×",
                  "size", "trident µs", f"{name} µs", "×"], rows)


def ops_full(run: dict) -> list[str]:
    rows = []
    for (op, model, layer, m), impls in _by(run["rows"], "op", "model", "layer", "M").items():
        fused, auto, plain = (impls.get(k) for k in ("trident_fused", "trident_auto", "plain"))
        rows.append([op, _layer(model, layer), m, cells(fused),
                     f"{cells(auto)} ({(auto or {}).get('choice') or DASH})", cells(plain),
                     speedups(plain, fused), speedups(plain, auto),
                     cells(impls.get("torch_symm_mem"), ("eager_us", "graph_us"))])
    return table(["op", "layer", "M", "trident fused", "trident auto (choice)",
                  "plain: NCCL + cuBLAS", "fused vs plain", "auto vs plain",
                  "torch symm-mem (eager · graph)"], rows)


def _layer(model, layer) -> str:
    """'llama3-70b attn_out' (the model is part of a layer's name: two models' layers of
    the same name have different shapes)."""
    return f"{model} {layer}" if model else str(layer)


def ops_compact(run: dict) -> list[str]:
    """One row per op, on its first layer (model and layer): the smallest and the largest
    M, auto (what a call gets) against NCCL + cuBLAS."""
    rows = []
    groups = _by(run["rows"], "op", "model", "layer", "M")
    for op in dict.fromkeys(k[0] for k in groups):
        first = next(k[:3] for k in groups if k[0] == op)
        ms = sorted(k[3] for k in groups if k[:3] == first)
        row = [f"{op} ({_layer(*first[1:])})"]
        for m in (ms[0], ms[-1]):
            auto, plain = (groups[(*first, m)].get(k) for k in ("trident_auto", "plain"))
            row += [m, f"{cells(auto, ('eager_us', 'graph_us'))} "
                       f"({(auto or {}).get('choice') or DASH})",
                    cells(plain, ("eager_us", "graph_us")), speedups(plain, auto)]
        rows.append(row + [_winners_by_m(groups, op, "graph_us")])
    return table(["op (layer)", "M", "trident µs (auto's pick)", "NCCL + cuBLAS µs", "×",
                  "M", "trident µs (auto's pick)", "NCCL + cuBLAS µs", "×",
                  "fastest from graphs, by M (layers won, all of the run's)"], rows)


OPS_RIVALS = ("plain", "torch_symm_mem")    # besides the trident_<schedule> rows
# the rivals as the API names them (bench ops' row "torch_symm_mem" is torch's async-TP,
# the schedule "async_tp")
SHOWN = {"torch_symm_mem": "async_tp (torch)"}


def _fastest(impls: dict, key: str):
    """(name, us) of the fastest schedule or baseline of one ops case in mode `key`
    (trident_<name> as <name>; auto's own row left out), or None."""
    times = {n[len("trident_"):] if n.startswith("trident_") else SHOWN.get(n, n): r.get(key)
             for n, r in impls.items()
             if (n.startswith("trident_") or n in OPS_RIVALS) and n != "trident_auto"
             and r.get("status", "ok") == "ok" and r.get(key)}      # (older runs: no status)
    return min(times.items(), key=lambda kv: kv[1]) if times else None


def _wins(groups: dict, op: str, m: int, key: str) -> dict:
    """{schedule or baseline: on how many of the run's layers it was fastest} at op, M."""
    wins: dict = {}
    for k, impls in groups.items():
        best = _fastest(impls, key) if k[0] == op and k[3] == m else None
        if best is not None:
            wins[best[0]] = wins.get(best[0], 0) + 1
    return wins


def _winners_by_m(groups: dict, op: str, key: str) -> str:
    """'1: plain 2/4 · 64-1024: sequential 4/4 · ...': per M the schedule fastest on the
    most layers (ties: each), consecutive Ms of the same text merged."""
    parts: list = []
    for m in sorted({k[3] for k in groups if k[0] == op}):
        wins = _wins(groups, op, m, key)
        if not wins:
            continue
        top = max(wins.values())
        text = ", ".join(f"{n} {c}/{sum(wins.values())}" for n, c in sorted(wins.items())
                         if c == top)
        if parts and parts[-1][2] == text:
            parts[-1][1] = m
        else:
            parts.append([m, m, text])
    return " · ".join(f"{a}{'' if a == b else f'-{b}'}: {t}" for a, b, t in parts) or DASH


def ops_winners(run: dict) -> list[str]:
    """Which schedule (or baseline) was fastest, per op and M, over the run's layers:
    'sequential 3, plain 1' = fastest on 3 layers, plain on 1; graph and eager; and on
    how many layers auto's own row was within 2 % of that fastest."""
    groups = _by(run["rows"], "op", "model", "layer", "M")
    rows = []
    for op in dict.fromkeys(k[0] for k in groups):
        for m in sorted({k[3] for k in groups if k[0] == op}):
            cases = [impls for k, impls in groups.items() if k[0] == op and k[3] == m]
            row = [op, m]
            for key in ("graph_us", "eager_us"):
                wins, near = _wins(groups, op, m, key), 0
                for impls in cases:
                    best = _fastest(impls, key)
                    mine = (impls.get("trident_auto") or {}).get(key)
                    near += bool(best and mine and mine <= 1.02 * best[1])
                row += [", ".join(f"{n} {c}" for n, c in sorted(
                    wins.items(), key=lambda kv: (-kv[1], kv[0]))) or DASH,
                        f"{near} of {sum(wins.values())}"]
            rows.append(row)
    return table(["op", "M", "fastest from graphs (layers)", "auto within 2 %",
                  "fastest eagerly (layers)", "auto within 2 %"], rows)


SMALL_M = 64        # issue 30's decode sizes: where "epilogue" is meant to beat "sequential"
EPILOGUE_TARGET = 1.1


def ops_small_m(run: dict) -> list[str]:
    """Per op, layer and M <= SMALL_M of a run that timed the schedules: plain, sequential,
    epilogue and fused (eager · graph), the GEMM alone (cuBLAS; trident's core), NCCL's
    collective alone, the run's floor; epilogue against sequential; and sequential over the
    faster GEMM alone (graph): what a schedule whose communication cost nothing would gain
    over sequential -- below the 1.1× target, no fusion that runs these GEMMs reaches it.
    Empty for runs without epilogue and sequential rows."""
    groups = _by(run["rows"], "op", "model", "layer", "M")
    rows = []
    for (op, model, layer, m), impls in sorted(groups.items(),
                                              key=lambda kv: (kv[0][0], kv[0][3])):
        seq, epi = impls.get("trident_sequential"), impls.get("trident_epilogue")
        if m > SMALL_M or seq is None or epi is None:
            continue
        any_row = next(iter(impls.values()))
        gemms = [v for v in (any_row.get("gemm_us"), any_row.get("gemm_only_us")) if v]
        rows.append([op, _layer(model, layer), m,
                     *(cells(impls.get(k), ("eager_us", "graph_us")) for k in
                       ("plain", "trident_sequential", "trident_epilogue", "trident_fused")),
                     us(any_row.get("gemm_us")), us(any_row.get("gemm_only_us")),
                     us(any_row.get("comm_us")), us(any_row.get("floor_us")),
                     speedups(seq, epi),
                     times(seq.get("graph_us"), min(gemms)) if gemms else DASH])
    if not rows:
        return []
    return [f"At M <= {SMALL_M}, the schedules against `sequential` (µs, eager · graph; "
            "the GEMM and NCCL alone and the floor from graphs). `epilogue vs sequential`: "
            f"above 1, epilogue is faster; issue 30's target is {EPILOGUE_TARGET}×. `bound`: "
            "sequential's graph time over the faster GEMM alone (cuBLAS or trident's core): "
            "the most any schedule running that GEMM could gain over sequential if its "
            "communication cost nothing (docs/fused-ops.md).", ""] + table(
        ["op", "layer", "M", "plain", "sequential", "epilogue", "fused", "cuBLAS alone",
         "trident core alone", "NCCL alone", "floor", "epilogue vs sequential", "bound"],
        rows)


def epilogue_met(run: dict) -> str | None:
    """'3 of 28 from graphs, 12 of 28 eagerly': cases at M <= SMALL_M where epilogue
    reached EPILOGUE_TARGET× sequential; None if the run timed neither."""
    parts = []
    for key, how in (("graph_us", "from graphs"), ("eager_us", "eagerly")):
        met = total = 0
        for (_, _, _, m), impls in _by(run["rows"], "op", "model", "layer", "M").items():
            seq, epi = impls.get("trident_sequential"), impls.get("trident_epilogue")
            if m <= SMALL_M and seq and epi and seq.get(key) and epi.get(key):
                total += 1
                met += seq[key] >= EPILOGUE_TARGET * epi[key]
        if total:
            parts.append(f"{met} of {total} {how}")
    return ", ".join(parts) or None


def _moe_phase(impls_rows, impl, phase):
    return next((r for r in impls_rows if r["impl"] == impl and r["phase"] == phase), None)


def moe_full(run: dict) -> list[str]:
    """One row per trident path and phase (dispatch, combine, their round, and the variants
    the run measured), beside torch.distributed's same phase."""
    rows = []
    cases: dict = {}
    for r in run["rows"]:
        cases.setdefault((r["model"], r["tokens"]), []).append(r)
    for (model, tokens), rs in cases.items():
        for r in rs:
            if r["impl"] == "torch.distributed":
                continue
            base = _moe_phase(rs, "torch.distributed", r["phase"])
            rows.append([model, tokens, r["impl"], r["phase"], cells(r),
                         cells(base, ("eager_us", "host_us")),
                         times((base or {}).get("eager_us"), r.get("eager_us")),
                         rate(r.get("GBps")), us(r.get("floor_us"))])
    return table(["model", "tokens per rank", "trident path", "phase", "trident",
                  "torch.distributed (eager · host)", "× (eager)", "GB/s", "floor"], rows)


def moe_compact(run: dict) -> list[str]:
    rows = []
    cases: dict = {}
    for r in run["rows"]:
        cases.setdefault((r["model"], r["tokens"]), []).append(r)
    for (model, tokens), rs in cases.items():
        total = _moe_phase(rs, "trident", "total")
        base = _moe_phase(rs, "torch.distributed", "total")
        rows.append([model, tokens, cells(total), cells(base, ("eager_us",)),
                     times((base or {}).get("eager_us"), (total or {}).get("eager_us"))])
    return table(["model", "tokens per rank", "trident round µs (eager · graph · host)",
                  "torch.distributed round µs (eager)", "× (eager)"], rows)


def gemm_full(run: dict) -> list[str]:
    rows = []
    for (shape, m, n, k), impls in _by(run["rows"], "shape", "M", "N", "K").items():
        cublas = impls.get("cublas")
        mine = next((r for name, r in impls.items() if str(name).startswith("table:")), None) \
            or next((r for r in impls.values() if r.get("table") is True), None)
        timed = [(r["graph_us"], name) for name, r in impls.items()
                 if name != "cublas" and r.get("graph_us")]
        best = min(timed) if timed else None
        rows.append([shape, m, n, k, cells(cublas, ("eager_us", "graph_us")),
                     cells(mine, ("eager_us", "graph_us")),
                     times((cublas or {}).get("graph_us"), (mine or {}).get("graph_us")),
                     f"{_config(best[1])}: {times((cublas or {}).get('graph_us'), best[0])}"
                     if best else DASH, us((cublas or {}).get("floor_us"))])
    return table(["shape", "M", "N", "K", "cuBLAS (eager · graph)",
                  "trident, the table's config (eager · graph)", "trident vs cuBLAS (graph)",
                  "fastest config vs cuBLAS (graph)", "floor"], rows)


def _config(name: str) -> str:
    return "the table's" if name.startswith("table:") else name


def p2p_full(run: dict) -> list[str]:
    rows = [[r["impl"], r.get("grid") or DASH, r["bytes_per_peer"] >> 20, us(r["us"]),
             f"{r['GBps']:.0f}", us(r.get("floor_us"))] for r in run["rows"]]
    return table(["impl", "programs", "MiB per peer", "µs", "GB/s", "floor µs"], rows)


def tp_full(run: dict) -> list[str]:
    impls = list(dict.fromkeys(r["impl"] for r in run["rows"]))
    base_name = "nccl" if "nccl" in impls else ("gloo" if "gloo" in impls else None)
    rows = []
    for (kind_, batch), group in _by(run["rows"], "kind", "batch").items():
        base = group.get(base_name)
        fused = group.get("trident_fused")
        rows.append([kind_, batch, *(cells(group.get(i), ("eager_us", "graph_us"))
                                     for i in impls), speedups(base, fused),
                     f"{fused['rel_err']:.3f}" if fused and fused.get("rel_err") is not None
                     else DASH])
    return table(["kind", "batch", *impls, f"trident_fused vs {base_name}",
                  "trident_fused rel_err"], rows)


def ops_all(run: dict) -> list[str]:
    small = ops_small_m(run)
    return ops_full(run) + [""] + ops_winners(run) + ([""] + small if small else [])


FULL = {"ccl": ccl_full, "ops": ops_all, "moe": moe_full, "gemm": gemm_full,
        "p2p": p2p_full, "tp": tp_full}
COMPACT = {"ccl": ccl_compact, "ops": ops_compact, "moe": moe_compact}


# ---------------------------------------------------------------- the three documents

def results_md(runs: list[dict]) -> str:
    out = ["# Results", "",
           "Generated by `python bench/make_results.py` from the JSON in `bench/results/` "
           "(do not edit by hand: rerun it). For each family, the latest run of each device "
           "kind (a run of some ops only is listed beside it). Cells `a · b · c` are **eager · graph · host** µs: eager = calls queued back "
           "to back, device time per call; graph = the same calls replayed from one CUDA graph; "
           "host = Python time per call; all max over ranks (`trident/bench/common.py`). "
           "`x×` = the baseline's time / trident's in the same run and mode (above 1: trident "
           "is faster). floor = the bytes over the usable NVLink rate (370 GB/s), or the GEMM's "
           "own floor. A run marked *ranks share one GPU* checks correctness and host cost, "
           "not link speed. Every run file is listed in "
           "[bench/results/README.md](../bench/results/README.md).", ""]
    for family in FAMILIES:
        out += [f"## {TITLES[family]}", ""]
        for run in latest(runs, family):
            only = part(run, runs)
            out += [f"### {kind(run)}, {run['date'][:10]}" + (f" ({only} only)" if only else ""), "",
                    setup(run, "../bench/results/", where=False), ""] + FULL[family](run) + [""]
    return "\n".join(out).rstrip() + "\n"


SHORT = {"ccl": "Collectives", "ops": "Fused GEMM + communication", "moe": "MoE round"}


def compact_block(runs: list[dict], family: str) -> list[str]:
    run = headline_run(runs, family)
    title = f"**{SHORT[family]}** (`trident bench {family}`)"
    if run is None:
        return [f"{title}: no run on GPUs yet."]
    extra = ""
    if family == "ops" and epilogue_met(run):
        extra = (f" · `epilogue` >= {EPILOGUE_TARGET}× `sequential` at M <= {SMALL_M}: "
                 f"{epilogue_met(run)} (why: docs/fused-ops.md)")
    return [f"{title}: {setup(run, 'bench/results/')}{extra}", ""] + COMPACT[family](run)


def rewrite_blocks(text: str, runs: list[dict]) -> str:
    """`text` with every `<!-- results:FAMILY -->...<!-- /results:FAMILY -->` block
    regenerated."""
    def block(m):
        family = m.group(1)
        if family not in COMPACT:
            raise ValueError(f"README: no compact table for family {family!r}")
        return (f"<!-- results:{family} -->\n" + "\n".join(compact_block(runs, family))
                + f"\n<!-- /results:{family} -->")
    return re.sub(r"<!-- results:(\w+) -->.*?<!-- /results:\1 -->", block, text, flags=re.S)


# what a run log is, by the start of its name (the files whose JSON sits beside them are
# "console output"); the device and date come from the rest of the name
LOGS = {"gpu-test-runs": "pytest summaries of the test suite, several GPU runs",
        "gpu-tests": "the test suite (or parts of it) on GPUs: pytest output",
        "reliability-nsg": "tests/faults/test_no_silent_garbage.py on GPUs: pytest output",
        "reliability-tests": "issue 29's reliability tests (test_no_silent_garbage and the "
                             "collectives' tests) on GPUs: pytest output",
        "nodes1": "tests across nodes with every rank on one GPU: pytest output",
        "profile-nodes": "bench/profile_nodes.py: CUDA activities and host time per call of "
                         "the collectives across nodes",
        "soak": "the soak (`bench/lab/soak.py`; `trident.bench.soak` before issue 32): random "
                "collectives, eager and from CUDA graphs, checked against a reference",
        "tp-decode": "examples/tp_decode.py under torch.compile"}


def _device(stem: str) -> str:
    """'2on1xh100' -> '2 ranks on 1x H100', '4xh200' -> '4x H200' (from a file name)."""
    m = re.search(r"-(\d+)on(\d+)x(h\d+)", stem)
    if m:
        return f"{m.group(1)} ranks on {m.group(2)}x {m.group(3).upper()}"
    m = re.search(r"-(\d+)x(h\d+)", stem)
    return f"{m.group(1)}x {m.group(2).upper()}" if m else ""


def _first_comment(path: str) -> str | None:
    with open(path, errors="replace") as f:
        first = f.readline().strip()
    if first.startswith("#"):
        first = first.lstrip("# ").strip()
        return first if len(first) <= 160 else first[:157] + "..."
    return None


def describe(name: str, docs: dict[str, dict], latest_files: set[str]) -> str:
    """What the file `name` of bench/results/ is."""
    stem, ext = os.path.splitext(name)
    if ext == ".json" and name in docs:
        d = docs[name]
        if d.get("suite") and d.get("rows") is not None:
            text = (f"`{d['suite']}` results: {d.get('device', '?')}, world size "
                    f"{d.get('world_size', '?')}, {d.get('date', '?')}, {len(d['rows'])} rows")
            if d.get("trident_gemm") and "-ab-" in stem:
                text += f", TRIDENT_GEMM={d['trident_gemm']} (an A/B run)"
            if d.get("marked"):
                text += f" ({d['marked']})"
            if d["suite"] in FAMILIES:
                text += "; in docs/results.md" if name in latest_files else \
                    "; superseded by a later run of this device kind"
            return text
        if d.get("traceEvents") is not None:
            return "Perfetto trace (`trident trace`): open in ui.perfetto.dev"
        about = d.get("what") or (f"`{d['suite']}` output" if d.get("suite") else "data")
        return f"{about} ({d.get('device', '?')}, {d.get('date', '?')})"
    first = _first_comment(os.path.join(RESULTS, name))
    if os.path.exists(os.path.join(RESULTS, stem + ".json")):
        return f"console output of the run in `{stem}.json`" + (f". {first}" if first else "")
    what = next((v for k, v in LOGS.items() if stem.startswith(k + "-")), "run log")
    date = re.search(r"\d{4}-\d{2}-\d{2}\w?$", stem)
    where = ", ".join(x for x in (_device(stem), date.group(0) if date else "") if x)
    return what + (f" ({where})" if where else "") + (f". {first}" if first else "")


def index_md(runs: list[dict]) -> str:
    names = sorted(n for n in os.listdir(RESULTS) if n != "README.md" and not n.startswith("."))
    docs = {}
    for n in names:
        if n.endswith(".json"):
            with open(os.path.join(RESULTS, n)) as f:
                docs[n] = json.load(f)
    latest_files = {r["_file"] for f in FAMILIES for r in latest(runs, f)}
    stems = sorted((n[:-5] for n in docs), key=len, reverse=True)
    rows, pngs = [], {}
    for n in names:
        if n.endswith(".png"):        # plots: one row per run, naming what each shows
            stem = next((j for j in stems if n[:-4] == j or n.startswith(j + "-")), n[:-4])
            pngs.setdefault(stem, []).append(n[len(stem):-4].lstrip("-") or stem)
        else:
            rows.append([f"`{n}`", describe(n, docs, latest_files).replace("|", "/")])
    rows += [[f"`{stem}.png`", f"plot of `{stem}.json`"] if parts == [stem] else
             [f"`{stem}-*.png`", f"plots of `{stem}.json`: " + ", ".join(parts)]
             for stem, parts in pngs.items()]
    return "\n".join(
        ["# bench/results", "",
         "The committed run files: JSON written by `trident bench` (`--out-dir bench/results` "
         "in the GPU scripts, bench/gpu_*.sh), their console logs, plots, and logs of test "
         "runs on GPUs. Generated by `python bench/make_results.py` (rerun it after adding a "
         "file); the tables made from the JSON are in [docs/results.md](../../docs/results.md).",
         ""] + table(["file", "what it is"], rows)) + "\n"


def generate() -> dict[str, str]:
    """{path: the text it should hold} for the three generated documents."""
    runs = load_runs()
    with open(README) as f:
        readme = f.read()
    return {DOC: results_md(runs), README: rewrite_blocks(readme, runs), INDEX: index_md(runs)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if a generated document differs from the file")
    args = p.parse_args(argv)
    stale = []
    for path, text in generate().items():
        old = open(path).read() if os.path.exists(path) else None
        if old != text:
            stale.append(os.path.relpath(path, ROOT))
            if not args.check:
                with open(path, "w") as f:
                    f.write(text)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run python bench/make_results.py")
        return 1
    print(("rewrote " + ", ".join(stale)) if stale else "up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
