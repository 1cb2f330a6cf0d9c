"""The "async_tp" schedule (trident/ops/async_tp.py: torch's async-TP ops as a schedule):
its registration, its refusal where it cannot run (the CPU emulation, ranks sharing a GPU,
a torch without symm_mem, matmul_all_reduce), auto never picking it there but the next
fastest of the cell, the built-in table's mapping of the bench's torch_symm_mem rows, and
its bias / out handling. On ranks with a GPU each (2 GPUs: `pytest tests/ops/test_async_tp.py`
on them) the ranks' part runs it against fp32 torch instead of expecting the refusal."""
import json
from types import SimpleNamespace

import pytest
import torch

from trident.ops import _common, async_tp, auto, schedules
from trident.tools import tune_ops as tuning

from .reference import assert_close, make

AG, RS, AR = schedules.OPS


def test_registered_for_the_two_ops_torch_has():
    s = schedules.get("async_tp")
    assert s.ops == (AG, RS) and s.needs_nccl and s.auto and s.cost is None
    assert "async_tp" in schedules.valid_names(AG) and "async_tp" in schedules.valid_names(RS)
    assert "async_tp" not in schedules.valid_names(AR)
    with pytest.raises(ValueError, match="has no matmul_all_reduce: torch has no fused matmul"):
        schedules.normalize(AR, "async_tp")
    assert auto.estimate("async_tp", AG, 4096, 4096, 2, True) is None   # table only


def _gpu_ctx(**kw):
    return SimpleNamespace(backend="cuda", world_size=2, capturing=lambda: False,
                           nccl_available=True, ranks_per_device=1, **kw)


def test_unavailable_says_why():
    cpu = SimpleNamespace(backend="cpu", nccl_available=True)
    assert "CPU emulation" in schedules.unavailable(cpu, AG, "async_tp")
    shared = _gpu_ctx()
    shared.nccl_available, shared.ranks_per_device = False, 2
    assert "2 ranks share one GPU" in schedules.unavailable(shared, RS, "async_tp")
    assert schedules.unavailable(_gpu_ctx(), AG, "async_tp") is None
    assert schedules.unavailable(shared, RS, "sequential") is None


def test_named_where_it_cannot_run_raises_naming_those_that_can(monkeypatch):
    shared = _gpu_ctx()
    shared.nccl_available, shared.ranks_per_device = False, 2
    with pytest.raises(ValueError, match="share one GPU.*choose one of") as e:
        auto.resolve(shared, RS, "async_tp", 64, 4096, 4096)
    offered = str(e.value).split("choose one of")[1]
    assert "'sequential'" in offered and "'async_tp'" not in offered and "'plain'" not in offered
    monkeypatch.setattr(async_tp, "_symm_mem", lambda: None)          # an older torch
    with pytest.raises(ValueError, match=r"has no torch\.ops\.symm_mem\.fused_all_gather"):
        auto.resolve(_gpu_ctx(), AG, "async_tp", 64, 4096, 4096)
    assert auto.resolve(_gpu_ctx(), RS, "sequential", 64, 4096, 4096) == "sequential"


@pytest.fixture
def gpu_like(monkeypatch):
    """choose() as on an H100 pair of the committed run, with the built-in table."""
    auto.forget()
    monkeypatch.setattr(auto.selector, "device_name", lambda ctx: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(auto, "tuned", lambda world: (None, []))
    state = {"nccl": True}
    monkeypatch.setattr(auto, "_nccl_everywhere", lambda ctx: state["nccl"])
    yield state
    auto.forget()


def _async_tp_cells():
    return [e for e in auto.builtin() if e["best"] == "async_tp"]


def test_auto_takes_the_next_fastest_where_it_cannot_run(monkeypatch, gpu_like):
    cells = _async_tp_cells()
    assert cells, "the built-in table names no async_tp cell (bench/schedule_table.py)"
    for e in cells:
        for p in e["points"]:
            if "async_tp" not in p["times_us"]:
                continue
            M, N, K = p["M"], p["N"], p["K"]
            ctx = SimpleNamespace(backend="cuda", world_size=2, capturing=lambda: False,
                                  host_exchange=lambda what, payload=(), detail=None:
                                  ([list(payload)] * 2, None))
            graph = e["mode"] == "graph"
            times = dict(p["times_us"])
            for nccl, torch_ops in ((True, True), (False, True), (True, False)):
                auto.forget()
                gpu_like["nccl"] = nccl
                monkeypatch.setattr(async_tp, "_symm_mem",
                                    (lambda: torch.distributed._symmetric_memory)
                                    if torch_ops else (lambda: None))
                got = auto.choose(ctx, e["op"], M, N, K, graph=graph)
                allowed = {s: t for s, t in times.items()
                           if (nccl or s not in ("plain", "async_tp"))
                           and (torch_ops or s != "async_tp")}
                if got != min(allowed, key=lambda s: (allowed[s], s)):
                    # two shapes of this M and shared size: the cell's geomean decides
                    assert got in allowed, (e["op"], M, N, K, nccl, torch_ops, got)
                assert (got == "async_tp") == (nccl and torch_ops and
                                               min(times, key=times.get) == "async_tp"), \
                    (e["op"], M, N, K, nccl, torch_ops, got)


def test_table_maps_torch_symm_mem_rows_to_async_tp():
    def row(impl, us, status="ok"):
        return dict(impl=impl, op=AG, M=64, N=32, K=16, status=status, eager_us=us,
                    graph_us=us / 2)
    got = tuning.bench_rows([row("torch_symm_mem", 10.0), row("plain", 20.0),
                             row("trident_auto", 1.0), row("trident_fused", 5.0, "wrong: x")])
    assert {r["schedule"]: r["eager_us"] for r in got} == {"async_tp": 10.0, "plain": 20.0}
    # the schedule's own row, where the run has one, before or after torch's
    for rows in ([row("torch_symm_mem", 10.0), row("trident_async_tp", 11.0)],
                 [row("trident_async_tp", 11.0), row("torch_symm_mem", 10.0)]):
        (only,) = tuning.bench_rows(rows)
        assert only["schedule"] == "async_tp" and only["eager_us"] == 11.0
    with open(auto.TABLE_PATH) as f:
        doc = json.load(f)
    assert any("async_tp" in e["times_us"] for e in doc["entries"])
    assert not any("async_tp" in e["times_us"] for e in doc["entries"] if e["op"] == AR)


def test_bench_targets_count_torchs_row_once():
    """auto against the best of plain, torch_symm_mem and sequential: a trident_async_tp row
    (the same torch call through the op) is no rival of its own."""
    from trident.bench.ops import targets
    base = dict(op=AG, model="m", layer="l", M=4096, comm_share=0.5)
    rows = [dict(base, impl=i, eager_us=t, graph_us=t, choice="async_tp / async_tp")
            for i, t in (("trident_auto", 100.0), ("torch_symm_mem", 99.0),
                         ("trident_async_tp", 50.0), ("plain", 120.0),
                         ("trident_sequential", 110.0))]
    found = targets(rows)
    assert found["graph"]["auto_vs_best_misses"] == [] == found["eager"]["auto_vs_best_misses"]


def _fake_torch(op, group, a, w):
    """torch's op as one rank of a world of 2 whose peer holds the same a (a stand-in)."""
    y = (a.float() @ w.float().t())
    if op == AG:
        return torch.cat([y, y]).to(a.dtype)
    return (2 * y).chunk(2)[0].to(a.dtype)


def test_bias_and_out_as_the_other_schedules(monkeypatch):
    """The build's one step, with torch's op stood in for: a fresh call returns torch's
    tensor (bias added in place), a given out is filled; fp32 and bf16 biases."""
    monkeypatch.setattr(async_tp, "why_not", lambda ctx, op: None)
    monkeypatch.setattr(async_tp, "prepare", lambda ctx, op, a, w: "group")
    monkeypatch.setattr(async_tp, "torch_call", _fake_torch)
    ctx = SimpleNamespace(backend="cuda", world_size=2, device=torch.device("cpu"))
    a = make((3, 40), 1, torch.bfloat16, "cpu")
    w = make((24, 40), 2, torch.bfloat16, "cpu")
    for op, rows in ((AG, 6), (RS, 1)):
        a_op = a if op == AG else a[:2]
        for bias_dtype in (None, torch.float32, torch.bfloat16):
            bias = None if bias_dtype is None else make((24,), 3, bias_dtype, "cpu")
            ref = _fake_torch(op, None, a_op, w).float() + (0 if bias is None else bias.float())
            for given in (False, True):
                out = torch.full((rows, 24), float("nan"), dtype=torch.bfloat16) if given else None
                plan = _common.new_plan(ctx, a_op, w, bias, out, (rows, 24), "async_tp")
                async_tp.build(ctx, plan, op, a_op, w, bias, plan.tensors[3])
                plan.finish()
                fresh = plan.new_out()
                assert (fresh is None) == (not given)
                got = plan.run((a_op, w, bias, out))
                assert got is not None and (not given or got is out)
                assert_close(got, ref, f"{op} bias={bias_dtype} out={given}")


def _on_ranks(ctx):
    """Each op with schedule="async_tp": where it can run, against fp32 torch (odd M, bias,
    out) and auto's choice among what can run; elsewhere the ValueError saying why."""
    world, rank, ran = ctx.world_size, ctx.rank, []
    for op in (AG, RS):
        why = schedules.unavailable(ctx, op, "async_tp")
        a_full = make((3 * world, 64 * world), 10, torch.bfloat16, ctx.device)
        w_full = make((40, 64 * world), 11, torch.bfloat16, ctx.device)
        bias = make((40,), 12, torch.float32, ctx.device)
        if op == AG:
            a, w = a_full[rank * 3:(rank + 1) * 3, :64].contiguous(), w_full[:, :64]
            ref = a_full[:, :64].float() @ w.float().t() + bias
        else:
            cols = slice(rank * 64, (rank + 1) * 64)
            a, w = a_full[:, cols].contiguous(), w_full[:, cols].contiguous()
            ref = (a_full.float() @ w_full.float().t() + bias).chunk(world)[rank]
        w = w.contiguous()
        if why is not None:
            with pytest.raises(ValueError, match="choose one of") as e:
                getattr(ctx, op)(a, w, bias, schedule="async_tp")
            assert why in str(e.value) and "'sequential'" in str(e.value).split("choose")[1]
            M = a.shape[0] * (world if op == AG else 1)
            for graph in (False, True):
                assert auto.choose(ctx, op, M, w.shape[0], a.shape[1], graph) != "async_tp"
            continue
        for given in (False, True):
            out = torch.full(tuple(ref.shape), float("nan"), dtype=torch.bfloat16,
                             device=ctx.device) if given else None
            for call in range(2):                # the second runs the built plan
                got = getattr(ctx, op)(a, w, bias, out=out, schedule="async_tp")
                assert not given or got is out
                ctx.sync()
                assert_close(got, ref, f"{op} async_tp out={given} call {call} rank {rank}")
        seq = getattr(ctx, op)(a, w, bias, schedule="sequential")
        ctx.sync()
        assert_close(got, seq.float(), f"{op} async_tp against sequential rank {rank}")
        ran.append(op)
    with pytest.raises(ValueError, match="has no matmul_all_reduce"):
        ctx.matmul_all_reduce(torch.ones(2, 8, dtype=torch.bfloat16, device=ctx.device),
                              torch.ones(4, 8, dtype=torch.bfloat16, device=ctx.device),
                              schedule="async_tp")
    return ran


def test_on_ranks(pool):
    ran = pool.run(_on_ranks)
    assert all(r == ran[0] for r in ran)
    if ran[0]:                                   # GPUs of their own: both ops ran
        assert ran[0] == [AG, RS]
