"""Issue 30's rule on the committed measurements: "auto never picks the slower of two
schedules measured in the same run". For every case (op, shape, M) and mode (eager, graph)
of the two-GPU run that the built-in table (trident/ops/schedule_table.json) was made from
(bench/schedule_table.py), auto.choose with that table must pick a schedule whose time
measured there is within 2 % of the fastest schedule measured in the same row. On the CPU:
choose() is asked as on the run's GPUs (device name, NCCL on every rank)."""
import json
import os
from types import SimpleNamespace

import pytest

from trident.ops import auto, schedules
from trident.tools import tune_ops as tuning

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "bench", "results")
SLACK = 1.02


def _table_runs() -> dict:
    """{run file: its JSON} of the runs the built-in table names (its cells' `run`)."""
    with open(auto.TABLE_PATH) as f:
        names = {e.get("run") for e in json.load(f)["entries"]}
    assert None not in names, "a cell of schedule_table.json does not name its run: rebuild " \
                              "it with bench/schedule_table.py"
    out = {}
    for name in sorted(names):
        with open(os.path.join(RESULTS, name)) as f:
            out[name] = json.load(f)
    return out


def _cases(run: dict) -> dict:
    """{(op, model, layer, M, N, K): {schedule: row}}: trident_<schedule> rows, plain, and
    torch_symm_mem as "async_tp" where the case has no trident_async_tp row (the table's
    mapping, tuning.schedule_of_row)."""
    cases: dict = {}
    for r in run["rows"]:
        name = tuning.schedule_of_row(r["impl"])
        if name is not None and r.get("status") == "ok":
            case = cases.setdefault((r["op"], r["model"], r["layer"], r["M"], r["N"], r["K"]),
                                    {})
            if name not in case or r["impl"] != "torch_symm_mem":
                case[name] = r
    return cases


class _Ranks(SimpleNamespace):
    """A rank of the run as choose() sees it; host_exchange: every rank sent the same."""

    def host_exchange(self, what, payload=(), detail=None):
        self.exchanges.append(what)
        return [list(payload)] * self.world_size, None


@pytest.fixture
def as_on_the_runs_gpus(monkeypatch):
    auto.forget()
    monkeypatch.setattr(auto, "tuned", lambda world: (None, []))   # not this machine's
    monkeypatch.setattr(auto, "_nccl_everywhere", lambda ctx: True)
    yield monkeypatch
    auto.forget()


def test_the_committed_table_names_the_two_gpu_runs():
    """Every cell names the run it was made from: a committed `trident bench ops` run on
    GPUs of their own (today bench/results/ops-2xh100-2026-11-25b.json)."""
    runs = _table_runs()
    assert runs
    for run in runs.values():
        assert run["suite"] == "ops" and run["backend"] == "cuda"
        assert run.get("ranks_per_gpu", 1) == 1 and run["world_size"] >= 2


def test_auto_never_picks_a_schedule_measured_slower(as_on_the_runs_gpus):
    checked, misses = 0, []
    for name, run in _table_runs().items():
        as_on_the_runs_gpus.setattr(auto.selector, "device_name", lambda ctx, d=run["device"]: d)
        ctx = _Ranks(backend="cuda", world_size=run["world_size"], capturing=lambda: False,
                     exchanges=[])
        for (op, model, layer, M, N, K), rows in _cases(run).items():
            for mode in auto.MODES:
                times = {s: r[f"{mode}_us"] for s, r in rows.items()
                         if r.get(f"{mode}_us") and schedules.get(s).auto}
                if not times:
                    continue
                got = auto.choose(ctx, op, M, N, K, graph=mode == "graph")
                best = min(times, key=times.get)
                checked += 1
                if got not in times or times[got] > SLACK * times[best]:
                    misses.append(f"{name} {op} {model} {layer} M={M} {mode}: auto {got} "
                                  f"{times.get(got)} us, {best} {times[best]:.1f} us")
    assert checked >= 100, f"only {checked} measured rows"
    assert not misses, f"{len(misses)} of {checked}:\n" + "\n".join(misses)


def test_shapes_that_differ_in_the_ranks_own_size(as_on_the_runs_gpus):
    """Two measured shapes of the same M and shared size whose fastest differ: the rank's
    own size decides only if every rank holds the same; else the cell's time."""
    as_on_the_runs_gpus.setattr(auto.selector, "device_name", lambda ctx: "GPU X")
    op = "matmul_all_reduce"
    cell = dict(op=op, device="GPU X", world_size=2, m_bucket="2-16", mode="eager",
                **{"class": "<=4096"}, times_us={"plain": 20.0, "sequential": 21.0},
                points=[dict(M=16, N=4096, K=2048, times_us={"plain": 10.0, "sequential": 14.0}),
                        dict(M=16, N=4096, K=7168, times_us={"plain": 40.0, "sequential": 31.5})])
    as_on_the_runs_gpus.setattr(auto, "builtin", lambda: [cell])
    ctx = _Ranks(backend="cuda", world_size=2, capturing=lambda: False, exchanges=[])
    assert auto.choose(ctx, op, 16, 4096, 7168) == "sequential"
    assert auto.choose(ctx, op, 16, 4096, 2048) == "plain"
    assert len(ctx.exchanges) == 2
    assert auto.choose(ctx, op, 16, 4096, 7168) == "sequential"       # remembered
    assert len(ctx.exchanges) == 2
    assert auto.choose(ctx, op, 8, 4096, 7168) == "plain"             # no point: the cell's

    class Uneven(_Ranks):
        def host_exchange(self, what, payload=(), detail=None):
            self.exchanges.append(what)
            return [list(payload), [p + 1 for p in payload]], None
    auto.forget()
    uneven = Uneven(backend="cuda", world_size=2, capturing=lambda: False, exchanges=[])
    assert auto.choose(uneven, op, 16, 4096, 7168) == "plain"         # the cell's


def _own_sizes(ctx):
    """_SameEverywhere through the context's real host exchange: the same own size on every
    rank, then one that differs on the last rank."""
    same = auto._SameEverywhere(ctx, "matmul_all_reduce", 2048)()
    last = ctx.rank == ctx.world_size - 1
    differs = auto._SameEverywhere(ctx, "matmul_all_reduce", 7168 if last else 2048)()
    return same, differs


def test_own_sizes_compared_across_ranks(pool):
    if pool.world_size == 1:
        pytest.skip("needs two ranks: one rank cannot hold a size that differs from its own")
    assert pool.run(_own_sizes) == [(True, False)] * pool.world_size


SMALL_M_BUCKETS = {"1": None, "2-16": 8, "17-64": 32}     # bucket: an M the run did not time
OTHER_S = {"<=4096": 3072, "<=8192": 6144}               # a shared size it did not time


def _gpu_ranks(device):
    return _Ranks(backend="cuda", world_size=2, capturing=lambda: False, exchanges=[])


def test_epilogue_at_decode_sizes_only_where_it_was_fastest(as_on_the_runs_gpus):
    """Issue 30: epilogue missed 1.1x sequential at M <= 64 on most shapes, so auto must
    not pick it there unless the run timed it fastest of all, in that mode (no slack)."""
    checked = picked = 0
    for name, run in _table_runs().items():
        as_on_the_runs_gpus.setattr(auto.selector, "device_name", lambda ctx, d=run["device"]: d)
        ctx = _gpu_ranks(run["device"])
        for (op, model, layer, M, N, K), rows in _cases(run).items():
            if M > 64 or "epilogue" not in rows:
                continue
            for mode in auto.MODES:
                times = {s: r[f"{mode}_us"] for s, r in rows.items()
                         if r.get(f"{mode}_us") and schedules.get(s).auto}
                got = auto.choose(ctx, op, M, N, K, graph=mode == "graph")
                checked += 1
                if got == "epilogue":
                    picked += 1
                    assert times["epilogue"] == min(times.values()), \
                        f"{name} {op} {model} {layer} M={M} {mode}: {times}"
    assert checked >= 56, checked          # 28 cases at M <= 64, eager and graph
    assert picked < checked


def test_unmeasured_decode_shapes_take_the_cells_fastest(as_on_the_runs_gpus):
    """At an M the run did not time (M = 8, 32), a shared size it did not time, or a rank's
    own size it did not time, auto takes the cell's fastest (geometric mean over the
    measured shapes) -- never epilogue where the cell's times say another is faster."""
    with open(auto.TABLE_PATH) as f:
        cells = json.load(f)["entries"]
    checked = 0
    for cell in cells:
        if cell["m_bucket"] not in SMALL_M_BUCKETS or cell["class"] not in OTHER_S:
            continue
        device = f"NVIDIA {cell['device']} 80GB HBM3"
        as_on_the_runs_gpus.setattr(auto.selector, "device_name", lambda ctx, d=device: d)
        ctx = _gpu_ranks(device)
        op, graph = cell["op"], cell["mode"] == "graph"
        times = {s: t for s, t in cell["times_us"].items() if schedules.get(s).auto
                 and schedules.unavailable(ctx, op, s, True) is None}
        fastest = min(times, key=lambda s: (times[s], s))
        M0, S0 = cell["points"][0]["M"], auto.shared_size(op, cell["points"][0]["N"],
                                                          cell["points"][0]["K"])
        probes = [(M0, OTHER_S[cell["class"]])]
        if SMALL_M_BUCKETS[cell["m_bucket"]]:
            probes.append((SMALL_M_BUCKETS[cell["m_bucket"]], S0))
        for M, S in probes:
            N, K = (1000, S) if op == "all_gather_matmul" else (S, 1000)
            got = auto.choose(ctx, op, M, N, K, graph=graph)
            checked += 1
            assert got == fastest, (cell["op"], cell["m_bucket"], cell["class"],
                                    cell["mode"], M, S, got, times)
            assert got != "epilogue" or times["epilogue"] == min(times.values())
    assert checked >= 40, checked
