"""`trident bench` where ranks share a GPU (forced on the CPU emulation, tests/shared_gpu.py):
every suite's JSON says so ("marked", "ranks_per_gpu") and so does its printed headline,
the NCCL / torch.distributed / plain baselines are rows that say why they did not run,
trident's rows are still timed (host_us included) and checked, and the selector-table
updates and the NCCL-based sweep refuse with a clear error."""
import importlib
import io
import json

import pytest

from bench.lab import sweep
from trident.bench import ccl, common, moe, ops, ops_norm, p2p, tp
from trident.runtime.launch import default_backend

from .conftest import get_pool
from .shared_gpu import RANKS_PER_GPU, as_shared_gpu

TIMING = {"calls": 1, "reps": 1, "warmup": 1, "synced_iters": 0}
# The forced mode is a CPU stand-in (its host groups are CPU-only); on a GPU machine whose
# ranks really share a GPU the bench is in that mode for real (bench/gpu_one.sh runs it).
pytestmark = pytest.mark.skipif(default_backend() == "cuda",
                                reason="forces the shared-GPU mode on the CPU emulation")


def _suites(ctx, out_dir):
    """Each suite once at its smallest, forced shared: {suite: its JSON document}, and the
    headline, the updates' errors and the sweep's."""
    paths, errors = {}, {}
    with as_shared_gpu(ctx):
        headline = common.headline(ctx)
        paths["ccl"] = ccl._run(ctx, ["all_reduce"], [1024], TIMING, out_dir, None)
        paths["ops"] = ops._run(ctx, ["matmul_all_reduce", ops_norm.NAME], [64], [], TIMING,
                                out_dir, None)
        paths["tp"] = tp._run(ctx, tp.TINY, [2], list(tp.IMPLS), TIMING, out_dir)
        paths["moe"] = moe._bench_rank(ctx, {"tiny-top1": (ctx.world_size, 1, 96)}, [4],
                                       TIMING, out_dir)[1]
        paths["p2p"] = p2p._bench_rank(ctx, 1024, [2], 1, out_dir)[1]
        for name, call in (
                ("ccl", lambda: ccl._run(ctx, ["all_reduce"], [1024], TIMING, out_dir, "")),
                ("ops", lambda: ops._run(ctx, ["matmul_all_reduce"], [64], [], TIMING,
                                         out_dir, "")),
                ("sweep", lambda: sweep.measure(ctx, ["all_reduce"], [2048],
                                                lambda size: TIMING))):
            try:
                call()
            except ValueError as exc:
                errors[name] = str(exc)
    if ctx.rank != 0:
        return None
    docs = {}
    for suite, path in paths.items():
        with open(path) as f:
            docs[suite] = json.load(f)
    return docs, headline, errors


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    return get_pool(2).run(_suites, str(tmp_path_factory.mktemp("bench")))[0]


def test_every_suite_is_marked_shared(shared_run):
    docs, headline, _ = shared_run
    assert common.SHARED_GPU in headline and common.NO_NCCL in headline
    for suite, doc in docs.items():
        assert doc["ranks_per_gpu"] == RANKS_PER_GPU, suite
        assert common.SHARED_GPU in doc["marked"], (suite, doc["marked"])


# the torch.distributed baseline of ccl and tp is named for its group: gloo in this CPU
# stand-in (common.baseline_name), nccl where ranks really share a GPU. ops: one plain row
# per op (matmul_all_reduce, matmul_all_reduce_add_rmsnorm); tp: step, sum_norm, linear
@pytest.mark.parametrize("suite,impl,kinds", [
    ("ccl", "gloo", 1), ("ops", "plain", 2), ("tp", "gloo", 3), ("moe", "torch.distributed", 3)])
def test_nccl_baselines_are_rows_that_say_why(shared_run, suite, impl, kinds):
    rows = shared_run[0][suite]["rows"]
    skipped = [r for r in rows if r["impl"] == impl]
    assert len(skipped) == kinds, skipped
    for r in skipped:
        assert r["note"] == common.NO_NCCL, r
        assert r["eager_us"] is None and r["host_us"] is None and r["graph_us"] is None, r
    others = [r for r in rows if r["impl"] != impl and not r.get("note")]
    assert others, f"{suite}: no trident rows"
    for r in others:                      # host time per warm call measured for every call
        assert r["eager_us"] > 0 and r["host_us"] > 0, r
        assert not any(v for k, v in r.items() if k.endswith(("_vs_nccl", "_vs_plain",
                                                                "_vs_torch"))), r


def test_trident_rows_are_checked_without_nccl(shared_run):
    docs = shared_run[0]
    auto = [r for r in docs["ccl"]["rows"] if r["impl"] == "trident_auto"]
    assert auto and all("nccl" not in r["choice"] for r in auto), auto
    auto = [r for r in docs["ops"]["rows"] if r["impl"] == "trident_auto"]
    assert auto and all("plain" not in r["choice"] for r in auto), auto
    ops_rows = [r for r in docs["ops"]["rows"] if r["impl"].startswith("trident_")]
    assert ops_rows and all(r["status"] == "ok" and r["rel_err"] < 3e-2 for r in ops_rows)
    assert {r["checked_against"] for r in ops_rows} == {"torch+trident collectives"}
    assert docs["ops"]["rows"][0]["comm_us"] is None
    # every trident implementation's rows checked: step, the op alone (sum_norm: not the
    # one kernel, whose GEMM is inside) and the GEMM + op (linear)
    tp_rows = [r for r in docs["tp"]["rows"] if r["impl"].startswith("trident")
               and r["impl"] != "trident_all_reduce_alone"]
    kinds: dict = {}
    for r in tp_rows:
        assert r["rel_err"] is not None and r["rel_err"] < 3e-2, r
        kinds.setdefault(r["impl"], []).append(r["kind"])
    # the sequential path, fused, fused_lamport and the one kernel
    assert set(kinds) == {i for i in tp.IMPLS if i.startswith("trident")}, kinds
    for impl, got in kinds.items():
        want = ["step", "linear"] if impl == tp.ONE_KERNEL else ["step", "sum_norm", "linear"]
        assert sorted(got) == sorted(want), (impl, got)
    assert {r["impl"] for r in docs["p2p"]["rows"]} == {"trident push", "trident pull"}


def test_updates_and_sweep_refuse(shared_run):
    errors = shared_run[2]
    assert set(errors) == {"ccl", "ops", "sweep"}, errors
    assert "ranks share one GPU" in errors["ccl"] and "--update-selector" in errors["ccl"]
    assert "ranks share one GPU" in errors["ops"] and "--update-crossover" in errors["ops"]
    assert common.NO_NCCL in errors["sweep"], errors["sweep"]


def test_print_table_adds_the_note_column():
    out = io.StringIO()
    common.print_table([{"impl": "nccl", "eager_us": None, "note": common.NO_NCCL},
                        {"impl": "trident", "eager_us": 3.5}], ["impl", "eager_us"], file=out)
    head, nccl_line, trident_line = out.getvalue().splitlines()
    assert head.split()[-1] == "note" and nccl_line.endswith(common.NO_NCCL)
    assert trident_line.split()[-1] == "-"


def test_default_world_is_at_least_two_on_gpus(monkeypatch):
    launch = importlib.import_module("trident.runtime.launch")   # (trident.launch: a function)
    monkeypatch.setattr(launch, "default_world_size", lambda backend: 1)
    assert common.default_world("cuda") == 2
    monkeypatch.setattr(launch, "default_world_size", lambda backend: 8)
    assert common.default_world("cuda") == 8
    assert common.default_world("cpu") == 2 and common.default_world("cpu", cpu=4) == 4
