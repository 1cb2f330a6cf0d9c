"""The tables of docs/results.md, one family of `trident bench` each (ccl, ops, moe, gemm,
p2p, tp: FULL), and the cells they and the README's compact tables share
(bench/make_results.py builds the documents from them).

Cells "a · b · c" are eager · graph · host in microseconds (bench/common.py: eager = calls
queued back to back, device time per call; graph = the same calls replayed from one CUDA
graph; host = Python time per call; all max over ranks). "x×" = baseline time / trident
time in the same mode (above 1: trident is faster).
"""
from __future__ import annotations

DASH = "–"


def kind(run: dict) -> str:
    """A run's device kind: its device, and its node layout across nodes."""
    return run["device"] + (f", nodes {run['nodes']}" if run.get("nodes") else "")

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


def grouped(rows, *keys):
    """Rows grouped by `keys`, in first-seen order: {(values): {impl: row}}."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in keys), {})[r.get("impl")] = r
    return groups


MODES = ("eager_us", "graph_us")
# each family's baselines (the bench's row names) as the API and the tables name them:
# torch_one_shot/_two_shot are torch symm-mem's all-reduces, torch_symm_mem its async-TP
# ops (the schedule "async_tp"), plain NCCL + cuBLAS, torch.distributed MoE's all_to_all
RIVALS = {"ccl": {"nccl": "NCCL", "nccl_symm": "NCCL symmetric", "gloo": "gloo",
                  "torch_one_shot": "symm-mem one_shot", "torch_two_shot": "symm-mem two_shot"},
          "ops": {"plain": "plain", "torch_symm_mem": "async_tp"},
          "moe": {"torch.distributed": "torch a2a"}}


def rivals(impls: dict, family: str) -> dict:
    """{name: row} of the baselines of one case ({impl: row}) that ran."""
    return {name: impls[k] for k, name in RIVALS[family].items()
            if k in impls and impls[k].get("status", "ok") == "ok"}


def versus(mine: dict | None, theirs: dict, note: str = "") -> str:
    """'7.3 · 5.2 vs symm-mem two_shot 8.0 · 6.3: 1.10× · 1.21×': trident's µs, eager ·
    graph (then `note`), the fastest of `theirs` ({name: row}) in each mode, named (once
    where one is fastest in both), and its time / trident's per mode."""
    if mine is None:
        return DASH
    best = [min(((r[k], n) for n, r in theirs.items() if r.get(k)), default=None)
            for k in MODES]
    named = {b[1] for b in best if b}
    if len(named) == 1:
        them = f"{named.pop()} " + " · ".join(us(b[0]) if b else DASH for b in best)
    else:
        them = " · ".join(f"{b[1]} {us(b[0])}" if b else DASH for b in best)
    ratio = " · ".join(times(b and b[0], mine.get(k)) for b, k in zip(best, MODES))
    return f"{cells(mine, MODES)}{note} vs {them}: {ratio}"


# ---------------------------------------------------------------- one family each

def _ccl_baseline(impls: dict) -> tuple[str, dict | None]:
    for name in ("nccl", "gloo"):
        if name in impls:
            return name, impls[name]
    return "nccl", None


def ccl_full(run: dict) -> list[str]:
    rows = []
    has_symm = any(r["impl"] == "nccl_symm" for r in run["rows"])
    for (op, size, _), impls in grouped(run["rows"], "op", "size", "bytes").items():
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
                     speedups(base, auto), versus(auto, rivals(impls, "ccl")), bw,
                     us((auto or {}).get("floor_us"))])
    base_name = _ccl_baseline({r["impl"]: r for r in run["rows"]})[0]
    return table(["op", "bytes per rank", "auto's choice (eager / graph)",
                  "trident auto", "fastest trident algorithm (graph)", base_name,
                  *(["nccl_symm (NCCL's symmetric kernels)"] if has_symm else []),
                  f"auto vs {base_name} (eager · graph)", "auto vs the fastest baseline",
                  f"busbw auto / {base_name} GB/s",
                  "floor"], rows)


def ops_full(run: dict) -> list[str]:
    rows = []
    for (op, model, layer, m), impls in grouped(run["rows"], "op", "model", "layer", "M").items():
        fused, auto, plain = (impls.get(k) for k in ("trident_fused", "trident_auto", "plain"))
        rows.append([op, layer_name(model, layer), m, cells(fused),
                     f"{cells(auto)} ({(auto or {}).get('choice') or DASH})", cells(plain),
                     speedups(plain, fused), speedups(plain, auto),
                     cells(impls.get("torch_symm_mem"), MODES),
                     versus(auto, rivals(impls, "ops"))])
    return table(["op", "layer", "M", "trident fused", "trident auto (choice)",
                  "plain: NCCL + cuBLAS", "fused vs plain", "auto vs plain",
                  "async_tp: torch's (eager · graph)", "auto vs the fastest baseline"], rows)


def layer_name(model, layer) -> str:
    """'llama3-70b attn_out' (the model is part of a layer's name: two models' layers of
    the same name have different shapes)."""
    return f"{model} {layer}" if model else str(layer)


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


def ops_winners(run: dict) -> list[str]:
    """Which schedule (or baseline) was fastest, per op and M, over the run's layers:
    'sequential 3, plain 1' = fastest on 3 layers, plain on 1; graph and eager; and on
    how many layers auto's own row was within 2 % of that fastest."""
    groups = grouped(run["rows"], "op", "model", "layer", "M")
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
    groups = grouped(run["rows"], "op", "model", "layer", "M")
    rows = []
    for (op, model, layer, m), impls in sorted(groups.items(),
                                              key=lambda kv: (kv[0][0], kv[0][3])):
        seq, epi = impls.get("trident_sequential"), impls.get("trident_epilogue")
        if m > SMALL_M or seq is None or epi is None:
            continue
        any_row = next(iter(impls.values()))
        gemms = [v for v in (any_row.get("gemm_us"), any_row.get("gemm_only_us")) if v]
        rows.append([op, layer_name(model, layer), m,
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
        for (_, _, _, m), impls in grouped(run["rows"], "op", "model", "layer", "M").items():
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


def table_pick(impls: dict, fallback: bool = True) -> dict | None:
    """Of one GEMM shape's rows {impl: row}, the candidate the package's tables pick
    (`table` true): what gemm.matmul runs. With `fallback`, "table:kdesc" (the same config
    with in-kernel descriptors, a check that is never picked) where no candidate is."""
    return next((r for n, r in impls.items() if r.get("table") is True
                 and not str(n).startswith("table:")), None) \
        or next((r for n, r in impls.items() if fallback and str(n).startswith("table:")), None)


def gemm_full(run: dict) -> list[str]:
    rows = []
    for (shape, m, n, k), impls in grouped(run["rows"], "shape", "M", "N", "K").items():
        cublas, mine = impls.get("cublas"), table_pick(impls)
        timed = [(r["graph_us"], name) for name, r in impls.items()
                 if name != "cublas" and r.get("graph_us")]
        best = min(timed) if timed else None
        rows.append([shape, m, n, k, cells(cublas, ("eager_us", "graph_us")),
                     cells(mine, ("eager_us", "graph_us")),
                     times((cublas or {}).get("graph_us"), (mine or {}).get("graph_us")),
                     f"{best[1]}: {times((cublas or {}).get('graph_us'), best[0])}"
                     if best else DASH, us((cublas or {}).get("floor_us"))])
    return table(["shape", "M", "N", "K", "cuBLAS (eager · graph)",
                  "trident, the table's pick (eager · graph)", "trident vs cuBLAS (graph)",
                  "fastest config vs cuBLAS (graph)", "floor"], rows)


def p2p_full(run: dict) -> list[str]:
    rows = [[r["impl"], r.get("grid") or DASH, r["bytes_per_peer"] >> 20, us(r["us"]),
             f"{r['GBps']:.0f}", us(r.get("floor_us"))] for r in run["rows"]]
    return table(["impl", "programs", "MiB per peer", "µs", "GB/s", "floor µs"], rows)


def tp_full(run: dict) -> list[str]:
    impls = list(dict.fromkeys(r["impl"] for r in run["rows"]))
    base_name = "nccl" if "nccl" in impls else ("gloo" if "gloo" in impls else None)
    rows = []
    for (kind_, batch), group in grouped(run["rows"], "kind", "batch").items():
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
