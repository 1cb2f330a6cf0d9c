"""Write the fused ops' built-in schedule table (trident/ops/schedule_table.json, what
schedule="auto" reads after a machine's own `trident tune --ops` table) from committed
`trident bench ops` runs on GPUs with one rank per GPU.

    python bench/schedule_table.py bench/results/ops-2xh100-2026-11-25.json [more.json ...]

Each run's rows that passed their value check become tuning rows (op, M, N, K, schedule,
eager_us, graph_us: trident_<name> is schedule <name>, plain is "plain", and torch_symm_mem
-- torch's async-TP ops, the same torch call as schedule "async_tp" (trident/ops/
async_tp.py) -- is "async_tp", where the run has no trident_async_tp row of the case; auto's
own rows are left out: tuning.bench_rows), and trident/tools/tune_ops.table turns them into
auto's cells: per
op, world size, M bucket, class of the shared size and mode, every schedule's geometric
mean over the cell's shapes, a schedule missing on one of them left out, and each shape's
own times (`points`). So "auto" never picks a schedule that the same run measured slower
than another. Of several runs of one GPU model and world size, the newest makes the cells
(each cell says which: `run`): times of two runs are not compared. Runs where ranks share a
GPU are refused: their times are HBM copies, not NVLink.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from trident.ops import auto, gemm_tables  # noqa: E402
from trident.tools import tune_ops as tuning  # noqa: E402


def rows_of(run: dict) -> list[dict]:
    """The run's tuning rows (tuning.bench_rows)."""
    return tuning.bench_rows(run["rows"])


def device_key(run: dict) -> str:
    """'H100' of '2x NVIDIA H100 80GB HBM3': auto matches it as a substring of the GPU's name."""
    model = gemm_tables.family(run["device"])
    if model == run["device"]:
        raise ValueError(f"no GPU model in {run['device']!r}")
    return model


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--out", default=auto.TABLE_PATH)
    args = p.parse_args(argv)
    runs = []
    for path in args.runs:
        with open(path) as f:
            run = json.load(f)
        if run.get("suite") != "ops":
            raise SystemExit(f"{path}: not a full `trident bench ops` run (suite "
                             f"{run.get('suite')!r})")
        if run.get("backend") != "cuda" or run.get("ranks_per_gpu", 1) != 1:
            raise SystemExit(f"{path}: not a run with one rank per GPU")
        runs.append((run["date"], path, run))
    # one run per GPU model and world size, the newest: a cell's times must all come from
    # one run (the times of two runs differ by more than the schedules do, eagerly)
    chosen: dict = {}
    for _, path, run in sorted(runs, key=lambda r: r[0]):
        chosen[(device_key(run), run["world_size"])] = (path, run)
    entries, sources = [], []
    for (model, world), (path, run) in chosen.items():
        name = os.path.basename(path)
        entries += [dict(e, run=name) for e in tuning.table(rows_of(run), model, world)]
        sources.append(f"{name} ({run['device']}, {run['date']})")
    used = {c[0] for c in chosen.values()}
    skipped = [os.path.basename(path) for _, path, _ in runs if path not in used]
    with open(args.out, "w") as f:
        json.dump({"about": "built by bench/schedule_table.py from " + "; ".join(sources)
                   + (f"; left out, older of the same GPU and world size: {', '.join(skipped)}"
                      if skipped else "")
                   + ": see trident/ops/auto.py", "entries": entries}, f, indent=1)
        f.write("\n")
    print(f"{args.out}: {len(entries)} cells from {len(sources)} run(s)")
    for e in entries:
        print(f"  {e['device']} w{e['world_size']} {e['op']:22} M {e['m_bucket']:>9} "
              f"{e['class']:>7} {e['mode']:5} best {e['best']:10} "
              + " ".join(f"{s}={t}" for s, t in e["times_us"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
