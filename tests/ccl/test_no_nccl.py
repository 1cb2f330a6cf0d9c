"""Where ranks share a GPU, NCCL cannot run (ctx.nccl_available False): the selectors
never pick the "nccl" / "plain" paths, asking for them raises a ValueError that names the
ranks per GPU and what can run, and "auto" runs trident's kernels, with right results.
The rank tests force the mode on the CPU emulation (tests/shared_gpu.py)."""
import json
import types

import pytest
import torch
import torch.distributed as dist

from trident.ccl import ALGORITHMS, selector
from trident.ops import auto, schedules, selector as ops_selector

from ..conftest import BACKEND, get_pool
from ..shared_gpu import RANKS_PER_GPU, as_shared_gpu
from .refs import rank_inputs, reduce_ref
from ..ops.reference import assert_close

SIZES = [1 << k for k in range(8, 31, 2)]


def _measured_tables() -> dict:
    """The built-in tables.json as a given document, so that its GPU-measured rows apply
    (the emulation would use the cost model)."""
    with open(selector.TABLES_PATH) as f:
        return json.load(f)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_collective_selector_without_nccl_picks_a_neighbouring_trident_row(graph):
    doc = _measured_tables()
    seen_nccl = 0
    for world in (2, 4):
        for op in ALGORITHMS:
            rows = selector.tables_for(world, doc, "given").rows["graph" if graph else "eager"][op]
            trident = [name for _, name in rows if name != "nccl"]
            for size in SIZES:
                with_nccl = selector.select(op, size, world, table=doc, graph=graph)
                got = selector.select(op, size, world, table=doc, graph=graph, nccl=False)
                assert got in ALGORITHMS[op], (op, world, size, got)
                if with_nccl != "nccl":
                    assert got == with_nccl, (op, world, size)
                else:
                    seen_nccl += 1
                    assert got in trident, (op, world, size, got, rows)
    assert seen_nccl, "the built-in tables no longer have nccl rows: this test checks nothing"


def test_selector_rule_without_nccl():
    """A "nccl" row gives way to the next trident row above it, else the last below; a
    table of nccl alone to the cost model."""
    doc = {"world_sizes": {"2": {"measured": True, "eager": {
        "all_reduce": [[1024, "one_shot"], [4096, "nccl"], [1 << 20, "two_shot"], [None, "nccl"]],
        "broadcast": [[None, "nccl"]]}}}}
    pick = lambda op, n: selector.select(op, n, 2, table=doc, nccl=False)  # noqa: E731
    assert [pick("all_reduce", n) for n in (512, 2048, 8192, 1 << 30)] == \
        ["one_shot", "two_shot", "two_shot", "two_shot"]
    assert selector.select("all_reduce", 2048, 2, table=doc) == "nccl"
    cost = selector.builtin()["cost_model"]["eager"]["broadcast"]
    assert pick("broadcast", 1 << 30) == cost[-1][1] != "nccl"


def _fake_gpu_ctx(nccl_available: bool):
    return types.SimpleNamespace(backend="cuda", world_size=2, nccl_available=nccl_available,
                                 ranks_per_device=1 if nccl_available else RANKS_PER_GPU,
                                 capturing=lambda: False)


def test_ops_auto_without_nccl_never_plain_and_plain_refused(monkeypatch):
    """Where ranks share a GPU, the fused ops' "auto" passes over "plain" even where the
    crossover measured it faster, and naming it ("plain", "nccl") raises, naming the ranks
    per GPU and the schedules that can run."""
    monkeypatch.setattr(ops_selector, "device_name", lambda ctx: "NVIDIA H200")
    monkeypatch.setattr(ops_selector, "_table", [
        {"op": "matmul_all_reduce", "device": "H200", "world_size": 2, "M": 64,
         "N": 4096, "K": 2048, "fused_us": 30.0, "plain_us": 20.0}])
    monkeypatch.setattr(auto, "tuned", lambda world: (None, []))
    monkeypatch.setattr(auto, "builtin", lambda: [])
    monkeypatch.setattr(auto, "_choices", {})
    monkeypatch.setattr(auto, "_agreed", lambda ctx, op: None)
    for ok in (True, False):
        ctx = _fake_gpu_ctx(ok)
        monkeypatch.setattr(auto, "_nccl_everywhere", lambda c, ok=ok: ok)
        got = auto.resolve(ctx, "matmul_all_reduce", "auto", 64, 4096, 2048)
        assert (got == "plain") == ok, (ok, got)
    shared = _fake_gpu_ctx(False)
    for name in ("plain", "nccl"):
        with pytest.raises(ValueError, match=rf"{RANKS_PER_GPU} ranks share one GPU.*"
                                             r"choose one of \['auto'"):
            auto.resolve(shared, "matmul_all_reduce", schedules.normalize(
                "matmul_all_reduce", name), 64, 4096, 2048)
    assert schedules.normalize("matmul_all_reduce", "nccl") == "plain"
    assert auto.resolve(_fake_gpu_ctx(True), "matmul_all_reduce", "plain", 64, 4096,
                        2048) == "plain"


# ---------------------------------------------------------------------------- on ranks
CPU_STAND_IN = pytest.mark.skipif(
    BACKEND != "cpu", reason="a CPU stand-in for ranks sharing a GPU; on GPUs the mode is "
    "real and the explicit-nccl cases of tests/ops and tests/torch_ops check the refusal")
def _expect_no_nccl(fn, what):
    try:
        fn()
    except ValueError as exc:
        text = str(exc)
        assert f"{RANKS_PER_GPU} ranks share one GPU" in text and "NCCL" in text, text
        assert "choose one of" in text, text
        return text
    raise AssertionError(f"{what}: asking for NCCL where ranks share a GPU did not raise")


def _collectives(ctx):
    w, r = ctx.world_size, ctx.rank
    xs = rank_inputs(w, (w * 40,), torch.float32, seed=71)
    with as_shared_gpu(ctx):
        assert not ctx.nccl_available and ctx.ranks_per_device == RANKS_PER_GPU
        t = xs[r].clone()
        calls = {
            "all_reduce": lambda alg: ctx.all_reduce(t, algorithm=alg),
            "all_gather": lambda alg: ctx.all_gather(torch.empty(w * 40), xs[r][:40].clone(),
                                                     algorithm=alg),
            "reduce_scatter": lambda alg: ctx.reduce_scatter(torch.empty(40), xs[r].clone(),
                                                             algorithm=alg),
            "all_to_all": lambda alg: ctx.all_to_all(torch.empty(w * 40), xs[r].clone(),
                                                     algorithm=alg),
            "broadcast": lambda alg: ctx.broadcast(xs[r].clone(), algorithm=alg),
        }
        for op, call in calls.items():
            text = _expect_no_nccl(lambda: call("nccl"), op)
            assert "'nccl'" not in text.split("choose one of")[1], text   # not offered
        _expect_no_nccl(lambda: ctx.all_reduce_add_rmsnorm(
            xs[r][:40].view(2, 20).clone(), torch.ones(2, 20), torch.ones(20),
            algorithm="nccl"), "all_reduce_add_rmsnorm")
        # "auto" runs trident's kernels, and right
        got = ctx.all_reduce(xs[r].clone())
        ref = reduce_ref(xs, "sum")
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        out = ctx.all_gather(torch.empty(w * 40), xs[r][:40].clone())
        torch.testing.assert_close(out, torch.cat([x[:40] for x in xs]))
        names = {key[0]: plan.name for key, plan in ctx.plans._plans.items()}
        assert "nccl" not in names.values(), names
    # and back as before: the "nccl" algorithm runs (through gloo here)
    t = xs[r].clone()
    ctx.all_reduce(t, algorithm="nccl")
    torch.testing.assert_close(t, ref, rtol=1e-5, atol=1e-5)


@CPU_STAND_IN
def test_collectives_refuse_nccl_where_ranks_share_a_gpu():
    get_pool(2).run(_collectives)


def _fused_ops(ctx):
    w, r = ctx.world_size, ctx.rank
    m, n, k = 16, 24, 32
    a_all = rank_inputs(w, (m, k), torch.bfloat16, seed=5)
    wt_all = rank_inputs(w, (n, k), torch.bfloat16, seed=6)
    with as_shared_gpu(ctx):
        for op in ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce"):
            for name in ("plain", "nccl"):
                text = _expect_no_nccl(
                    lambda: getattr(ctx, op)(a_all[r], wt_all[r], algorithm=name), op)
                assert "cuBLAS + NCCL" in text and "'fused'" in text, text
        got = ctx.matmul_all_reduce(a_all[r], wt_all[r])       # auto: one of trident's
        names = {key[0]: plan.name for key, plan in ctx.plans._plans.items()}
    ref = sum(a.float() @ wt.float().t() for a, wt in zip(a_all, wt_all))
    assert_close(got, ref, "matmul_all_reduce auto without NCCL")
    from trident.ops import schedules
    mine = {n for n, s in schedules.registered().items() if not s.needs_nccl}
    assert names.get("matmul_all_reduce") in mine, names
    dist.barrier(ctx.group)


@CPU_STAND_IN
def test_fused_ops_refuse_plain_where_ranks_share_a_gpu():
    get_pool(2).run(_fused_ops)
