"""docs/results.md, the README's result tables and bench/results/README.md, generated from
the committed run files in bench/results/, so that no figure is typed by hand.

    python bench/make_results.py            # rewrite the three from bench/results/*.json
    python bench/make_results.py --check    # exit 1 if a committed one differs (tests do this)

For each family of `trident bench` (ccl, ops, moe, gemm, p2p, tp), docs/results.md holds the
latest run of each device kind (the JSON's "device", plus its "nodes" across nodes), with
its date, device, versions and file, trident beside the baselines of the same run, eager and
graph (the tables: bench/results_tables.py); kinds of a GPU other than CURRENT_GPU are
labelled history.

The README's compact tables come from each family's newest runs on CURRENT_GPU GPUs of
their own (not shared, not across nodes, of every op: `part`), one per world size, side by
side: per op its smallest and its largest case, trident (auto's pick) against the fastest
baseline of the same run in each mode, named; the GEMM core's per M bucket. A block starts
at `<!-- results:FAMILY -->` and runs to the next such marker or to `<!-- /results -->`;
each is rewritten in place. docs/results.md ends with the same tables of the other GPUs'
runs (the README's before it moved to CURRENT_GPU), as history. bench/results/README.md
lists every file of bench/results/ with what it is.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from bench.results_tables import (  # noqa: E402
    DASH, EPILOGUE_TARGET, FULL, MODES, RIVALS, SMALL_M, epilogue_met, grouped, kind,
    layer_name, rivals, setup, table, table_pick, versus)

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
CURRENT_GPU = "H200"    # the GPU measured on now, the README's; other GPUs' runs are history


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


def gpu(run: dict) -> str:
    """A run's GPU model: 'H200' of '2x NVIDIA H200' (the device itself if it names none)."""
    m = re.search(r"NVIDIA (\S+)", run["device"])
    return m.group(1) if m else run["device"]


def headline_runs(runs: list[dict], family: str, model: str = CURRENT_GPU) -> list[dict]:
    """The newest run of `family` per world size on `model` GPUs of their own (not marked,
    not across nodes) that ran every op of the family, by world size."""
    best: dict = {}
    for r in latest(runs, family):
        w = r.get("world_size", 0)
        if (gpu(r) == model and not r.get("marked") and not r.get("nodes")
                and r.get("backend", "cuda") == "cuda" and not part(r, runs)
                and (w not in best or r["date"] > best[w]["date"])):
            best[w] = r
    return [best[w] for w in sorted(best)]


def newer_parts(runs: list[dict], run: dict) -> list[dict]:
    """The runs of some ops (or Ms) only of `run`'s kind that are newer than it."""
    return [r for r in latest(runs, run["suite"]) if kind(r) == kind(run)
            and part(r, runs) and r["date"] > run["date"]]


# ---------------------------------------------------------------- the README's tables

def ccl_cases(run: dict) -> dict:
    """{op: {bytes: (size, cell)}}: auto against the fastest baseline, per size."""
    out: dict = {}
    for (op, nbytes, size), impls in grouped(run["rows"], "op", "bytes", "size").items():
        out.setdefault(op, {})[nbytes] = (size, versus(impls.get("trident_auto"),
                                                       rivals(impls, "ccl")))
    return out


def ops_cases(run: dict) -> dict:
    """{'op (layer)': {M: ('M m', cell)}} on each op's first layer: auto (its pick, eager /
    graph) against the fastest baseline."""
    out: dict = {}
    first: dict = {}
    for (op, model, layer, m), impls in grouped(run["rows"], "op", "model", "layer", "M").items():
        if first.setdefault(op, (model, layer)) == (model, layer):
            auto = impls.get("trident_auto")
            pick = f" ({auto['choice']})" if auto and auto.get("choice") else ""
            out.setdefault(f"{op} ({layer_name(model, layer)})", {})[m] = (
                f"M {m}", versus(auto, rivals(impls, "ops"), pick))
    return out


def moe_cases(run: dict) -> dict:
    """{model: {tokens: ('n tokens', cell)}}: trident's round against torch's."""
    out: dict = {}
    for (model, tokens, phase), impls in grouped(run["rows"], "model", "tokens", "phase").items():
        if phase == "total":
            out.setdefault(model, {})[tokens] = (
                f"{tokens} token{'s' * (tokens != 1)}",
                versus(impls.get("trident"), rivals(impls, "moe")))
    return out


CASES = {"ccl": ccl_cases, "ops": ops_cases, "moe": moe_cases}
FIRST = {"ccl": "op", "ops": "op (layer)", "moe": "model (round: dispatch + combine)"}


def side_by_side(runs: list[dict], family: str) -> list[str]:
    """One row per op (model, for MoE); per run two columns, its smallest and its largest
    case: 'w GPUs, <case>' where every row's is the same, else the case leads the cell."""
    columns = []
    for run in runs:
        cases = CASES[family](run)
        for end, word in ((0, "smallest"), (-1, "largest")):
            picks = {row: sorted(c)[end] for row, c in cases.items()}
            labels = {cases[row][k][0] for row, k in picks.items()}
            same = labels.pop() if len(labels) == 1 else None
            columns.append((f"{run.get('world_size')} GPUs, {same or word}",
                            {row: ("" if same else cases[row][k][0] + ": ") + cases[row][k][1]
                             for row, k in picks.items()}))
            if all(len(c) == 1 for c in cases.values()):
                break
    rows = dict.fromkeys(row for _, col in columns for row in col)
    return table([FIRST[family], *(head for head, _ in columns)],
                 [[row, *(col.get(row, DASH) for _, col in columns)] for row in rows])


def _seen(runs: list[dict], family: str) -> dict:
    """{baseline's name: the ops it was timed for} over `runs`."""
    seen: dict = {}
    for r in (r for run in runs for r in run["rows"]):
        name = RIVALS[family].get(r["impl"])
        if name and r.get("status", "ok") == "ok" and any(r.get(k) for k in MODES):
            seen.setdefault(name, set()).add(r.get("op"))
    return seen


def baselines(runs: list[dict], family: str) -> str:
    """'NCCL; symm-mem one_shot, symm-mem two_shot (all_reduce only)': the baselines the
    runs timed, with the ops of those not timed for every op."""
    every = {r.get("op") for run in runs for r in run["rows"]}
    groups: dict = {}
    for name, ops in _seen(runs, family).items():
        groups.setdefault(frozenset(ops), []).append(name)
    return "; ".join(", ".join(names) + ("" if ops >= every else
                                         f" ({', '.join(sorted(ops))} only)")
                     for ops, names in groups.items())


def _geomean(xs: list) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def gemm_buckets(run: dict) -> dict:
    """{M: (shapes, [geometric mean over them of cuBLAS time / the table's pick's, per
    mode])} of a GEMM core run."""
    by_m: dict = {}
    for (_, m, _, _), impls in grouped(run["rows"], "shape", "M", "N", "K").items():
        pick, cublas = table_pick(impls), impls.get("cublas")
        if pick and cublas and pick.get("status", "ok") == "ok":
            by_m.setdefault(m, []).append([cublas[k] / pick[k] if cublas.get(k) and pick.get(k)
                                           else None for k in MODES])
    return {m: (len(v), [_geomean([x[i] for x in v]) for i in range(len(MODES))])
            for m, v in sorted(by_m.items())}


def _picks(run: dict) -> dict:
    """{(shape, M, N, K): the candidate the table picked} of a GEMM core run (None: no
    candidate row is the table's pick)."""
    return {key: (table_pick(impls, fallback=False) or {}).get("impl")
            for key, impls in grouped(run["rows"], "shape", "M", "N", "K").items()}


def gemm_runs(runs: list[dict], model: str = CURRENT_GPU) -> list[dict]:
    """The newest GEMM core run over every M of `model`, then the newer runs of its kind
    over some M only that timed the table's pick on every shape they ran."""
    whole = headline_runs(runs, "gemm", model)[:1]
    return whole + [r for r in (newer_parts(runs, whole[0]) if whole else [])
                    if None not in _picks(r).values()]


def gemm_compact(rows_of: list[dict]) -> list[str]:
    """One row per run (gemm_runs), one column per M bucket of the first: cuBLAS / the
    table's pick, eager · graph, with the shapes where fewer than the first run's."""
    first = gemm_buckets(rows_of[0])
    rows = []
    for run in rows_of:
        mine = gemm_buckets(run)
        rows.append([f"`{run['_file']}`"] + [
            DASH if m not in mine else " · ".join(f"{x:.2f}×" if x else DASH for x in mine[m][1])
            + ("" if mine[m][0] >= n else f" ({mine[m][0]} of {n} shapes)")
            for m, (n, _) in first.items()])
    return table(["run", *(f"M {m} ({n})" for m, (n, _) in first.items())], rows)


SHORT = {"ccl": "Collectives", "ops": "Fused GEMM + communication", "moe": "MoE round",
         "gemm": "GEMM core alone"}
ABOUT = {"ccl": "trident = auto's pick",
         "ops": "trident = auto (its pick, eager / graph); plain = NCCL + cuBLAS, async_tp = "
                "torch's fused ops",
         "moe": "tokens per rank; torch a2a = torch.distributed all_to_all_single of the "
                "(token, expert) rows, eager only",
         "gemm": "cuBLAS time / trident's with the config its table picks, geometric mean "
                 "over each M's shapes (how many: header; the layers' GEMMs at tensor "
                 "parallelism 2), eager · graph"}


def _newer(runs: list[dict], run: dict, link: str) -> str:
    """' · newer, all_reduce only: [file](..) (2026-11-28, adds NCCL symmetric; ...)'."""
    out = ""
    for r in newer_parts(runs, run):
        adds = [n for n in _seen([r], r["suite"]) if n not in _seen([run], run["suite"])]
        out += (f" · newer, {part(r, runs)} only: [{r['_file']}]({link}{r['_file']}) "
                f"({r['date'][:10]}{', adds ' + ', '.join(adds) if adds else ''}; "
                "docs/results.md)")
    return out


def _why_gemm(runs: list[dict], shown: list[dict]) -> str:
    """Why the first run of `shown` (gemm_runs) heads, and what the later rows are."""
    first, n = shown[0], len(_picks(shown[0]))
    ms = sorted(r["M"] for r in first["rows"])
    text = (f" · `{first['_file']}` is the newest run over every M ({ms[0]}-{ms[-1]}, {n} "
            "shapes), so it heads")
    for r in shown[1:]:
        mine, theirs = _picks(r), _picks(first)
        both = [k for k in mine if k in theirs]
        moved = sum(mine[k] != theirs[k] for k in both)
        text += (f"; `{r['_file']}`, newer, ran {part(r, runs)} only ({len(mine)} shapes), so "
                 f"it does not replace it: its table picks differ from the first row's on "
                 f"{moved} of the {len(both)} shapes both ran (the table changed between them)")
    return text


def compact_block(runs: list[dict], family: str, link: str = "bench/results/",
                  model: str = CURRENT_GPU) -> list[str]:
    """A family's caption (every run's date, device, world size, versions and file) and
    its compact table, of `model`'s runs."""
    shown = gemm_runs(runs, model) if family == "gemm" else headline_runs(runs, family, model)
    title = f"**{SHORT[family]}** (`trident bench {family}`; {ABOUT[family]}"
    if not shown:
        return [f"{title}): no run on {model} GPUs of their own yet."]
    if family != "gemm":
        title += f"; baselines: {baselines(shown, family)}"
    caption = title + "): " + "; ".join(setup(r, link) for r in shown)
    if family == "gemm":
        return [caption + _why_gemm(runs, shown), ""] + gemm_compact(shown)
    caption += "".join(_newer(runs, r, link) for r in shown)
    met = [f"{r.get('world_size')} GPUs: {epilogue_met(r)}" for r in shown
           if family == "ops" and epilogue_met(r)]
    if met:
        caption += (f" · `epilogue` >= {EPILOGUE_TARGET}× `sequential` at M <= {SMALL_M}: "
                    f"{'; '.join(met)} (why: docs/fused-ops.md)")
    return [caption, ""] + side_by_side(shown, family)


BLOCK = re.compile(r"<!-- results:(\w+) -->\n.*?(?=<!-- results:\w+ -->|<!-- /results -->)",
                   re.S)


def rewrite_blocks(text: str, runs: list[dict]) -> str:
    """`text` with every block from `<!-- results:FAMILY -->` to the next marker (or
    `<!-- /results -->`) regenerated."""
    def block(m):
        family = m.group(1)
        if family not in SHORT:
            raise ValueError(f"README: no compact table for family {family!r}")
        return f"<!-- results:{family} -->\n" + "\n".join(compact_block(runs, family)) + "\n"
    new, found = BLOCK.subn(block, text)
    if found != text.count("<!-- results:"):
        raise ValueError("README: a `<!-- results:FAMILY -->` block without a next marker or "
                         "`<!-- /results -->` after it")
    return new


# ---------------------------------------------------------------- the three documents

def results_md(runs: list[dict]) -> str:
    out = ["# Results", "",
           "Generated by `python bench/make_results.py` from the JSON in `bench/results/` "
           "(do not edit by hand: rerun it). For each family, the latest run of each device "
           "kind (a run of some ops only is listed beside it); runs of a GPU other than the "
           f"{CURRENT_GPU} are history (the project measures on {CURRENT_GPU}s now), and the "
           "README's tables of those GPUs close the page. Cells `a · b · c` are "
           "**eager · graph · host** µs: eager = calls queued back to back, device time per "
           "call; graph = the same calls replayed from one CUDA graph; host = Python time per "
           "call; all max over ranks (`trident/bench/common.py`). `x×` = the baseline's time "
           "/ trident's in the same run and mode (above 1: trident is faster); \"the fastest "
           "baseline\" is the fastest of the run's baselines in each mode, named. floor = the "
           "bytes over the usable NVLink rate (370 GB/s), or the GEMM's own floor. A run "
           "marked *ranks share one GPU* checks correctness and host cost, not link speed. "
           "Every run file is listed in [bench/results/README.md](../bench/results/README.md).",
           ""]
    for family in FAMILIES:
        out += [f"## {TITLES[family]}", ""]
        for run in sorted(latest(runs, family), key=lambda r: gpu(r) != CURRENT_GPU):
            only = part(run, runs)
            old = "" if gpu(run) == CURRENT_GPU else f" — history ({gpu(run)})"
            out += [f"### {kind(run)}, {run['date'][:10]}" + (f" ({only} only)" if only else "")
                    + old, "", setup(run, "../bench/results/", where=False), ""]
            out += FULL[family](run) + [""]
    for model in sorted({gpu(r) for r in runs if r.get("rows")} - {CURRENT_GPU}):
        blocks = [compact_block(runs, f, "../bench/results/", model) for f in SHORT]
        out += [f"## History: the README's tables on {model}", "",
                f"The README showed these until its results moved to {CURRENT_GPU} runs: the "
                f"newest {model} runs on GPUs of their own, in the README's layout.", ""]
        out += [line for b in blocks for line in b + [""]]
    return "\n".join(out).rstrip() + "\n"


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
