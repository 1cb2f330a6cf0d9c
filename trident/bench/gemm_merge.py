"""`python -m trident.bench.gemm_merge RUN.json [RUN.json ...] --update-table PATH`: a GPU's
GEMM table from several saved runs of `python -m trident.bench.gemm` on that GPU model,
instead of from one.

Why: one run's pick per shape class can flip on noise (about 4 % between runs at small M
on one H200), and a later run of only the table's own configs (`--candidates`) should
confirm or correct the picks, not replace the classes it measured with a narrower search.
Here every run's rows are pooled; summarize (bench/gemm.py) then takes, per class, the
geometric mean of each candidate's vs_cublas (each row against cuBLAS of its own run) over
every row it has, and a candidate must have run on every shape of the class in every run
that timed the class to be chosen. So classes that several runs timed are decided by the
candidates those runs share, and classes only one run timed are decided by that run.

Rows are re-classed with the edges of tables written now (gemm_tables.shape_class). The
runs must come from one GPU model; the table keeps the classes no run measured
(--keep-classes behaviour of bench/gemm.py) and the capability of the table already in
PATH (or --capability).
"""
from __future__ import annotations

import argparse
import json
import os

from ..ops import gemm, gemm_tables
from . import gemm as bench


def pooled_rows(runs: list[dict]) -> list[dict]:
    """Every timed row of `runs`, re-classed with the edges of tables written now."""
    devices = {r.get("gpu") for r in runs}
    if len(devices) != 1 or None in devices:
        raise ValueError(f"the runs must come from one GPU model, got {sorted(map(str, devices))}")
    return [dict(row, shape_class=gemm_tables.shape_class(row["M"], row["N"], row["K"]))
            for run in runs for row in run["rows"] if row.get("status") == "ok"]


def merge(paths: list[str], table_path: str, world: int = 2,
          capability: tuple | None = None) -> tuple:
    """Write the table of the runs at `paths` into `table_path` (bench.write_table with
    keep_classes); returns (the table, the file written)."""
    runs = [json.load(open(p)) for p in paths]
    rows = pooled_rows(runs)
    device = runs[0]["gpu"]
    if capability is None:
        old = gemm_tables.read(gemm_tables.file_at(table_path, device))[1].get(device)
        if old is None or not old.capability:
            raise ValueError(f"no table of {device} in {table_path} to take its capability "
                             f"from: pass --capability, e.g. 9,0")
        capability = old.capability
    names = {r["impl"] for r in rows} - {"cublas", "table:kdesc"}
    unknown = sorted(names - set(gemm.KNOWN))
    if unknown:
        raise ValueError(f"the runs name candidates this package does not know: {unknown}")
    result = {"device": device, "capability": tuple(capability),
              "hbm_read_gbps": min(r["hbm_read_gbps"] for r in runs)}
    best = {cls: (name, mean, _distinct_shapes(rows, cls), *rest)     # shapes, not rows
            for cls, (name, mean, _, *rest) in bench.summarize(rows).items()}
    source = (f"picked by `python -m trident.bench.gemm_merge` from the rows of "
              f"{', '.join(os.path.basename(p) for p in paths)}")
    return bench.write_table(table_path, result, best, {n: gemm.KNOWN[n] for n in names},
                             world, keep_classes=True, source=source)


def _distinct_shapes(rows: list[dict], cls: str) -> int:
    return len({(r["M"], r["N"], r["K"]) for r in rows if r["shape_class"] == cls})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m trident.bench.gemm_merge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="results JSON of bench gemm runs on one GPU model")
    p.add_argument("--update-table", "--write-table", dest="update_table", required=True,
                   metavar="PATH", help="the gemm table file (or folder) to write, as in "
                   "bench/gemm.py")
    p.add_argument("--world", type=int, default=2, help="tensor parallelism of the shapes")
    p.add_argument("--capability", default=None, help="e.g. 9,0 (default: the table's)")
    args = p.parse_args(argv)
    cap = tuple(int(x) for x in args.capability.split(",")) if args.capability else None
    table, path = merge(args.runs, args.update_table, args.world, cap)
    print(f"gemm table of {table.name} from {len(args.runs)} runs: {path}")
    for cls, entry in sorted(table.classes.items(), key=lambda kv: bench._class_order(kv[0])):
        print(f"  {cls:<20} {entry['config']:<26} {entry.get('geomean_vs_cublas', '-')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
