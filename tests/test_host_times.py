"""bench/lab/host_times.py, briefly, at world 1 on whatever backend the tests use (the CPU
emulation in CI: the C launch is a stand-in there, and the stages that need CUDA say so):
it runs end to end, reports every stage, and leaves the rank's plans as it found them."""
from bench.lab import host_times

from .conftest import BACKEND, get_pool

CUDA_ONLY = ("C launch", "kernel[grid]", "compiled launcher", "get_current_stream")


def _after(ctx):
    """A collective and an MoE round still run right after the script (its stand-ins
    undone, its plans dropped)."""
    t = ctx.zeros(8)
    t.fill_(1.0)
    ctx.all_reduce(t)
    ctx.sync()
    return len(ctx.plans), float(t[0])


def test_host_times_runs_and_reports_every_stage():
    pool = get_pool(1)
    result = host_times.run(1, calls=20, rounds=2, warmup=2, pool=pool)
    (rank,) = result["ranks"]
    stages = rank["stages"]
    for part in ("baseline: empty function call", "ctx.all_reduce(t)", "tensor_key(t)",
                 "ctx.plans.get(key)", "plan.run(tensors)", "ep.dispatch(x, idx)",
                 "ep.combine(expert_y, d, w)", "self.stream(self.device)",
                 "trident Launch.__call__"):
        assert any(part in name for name in stages), (part, sorted(stages))
    for name, us in stages.items():
        if BACKEND == "cpu" and any(s in name for s in CUDA_ONLY):
            assert us == host_times.NA, name
        else:
            assert isinstance(us, float) and us > 0, (name, us)
    assert "all_reduce" in host_times.table(result["ranks"])
    plans, value = pool.run(_after)[0]
    assert plans >= 1 and value == 1.0


def _graphs_setting(ctx):
    return ctx.plans.graphs


def test_plan_graphs_ab_runs_and_restores_the_setting():
    """bench/lab/plan_graphs.py: both modes timed for every case, the cache's setting
    back after it; on GPUs the "all" mode's MoE plans replay as graphs, "multi"'s
    single-kernel plans do not."""
    from bench.lab import plan_graphs
    pool = get_pool(1)
    before = pool.run(_graphs_setting)[0]
    result = plan_graphs.run(1, calls=2, rounds=2, warmup=1, pool=pool)
    (rank,) = result["ranks"]
    assert len(rank["rows"]) == 6, sorted(rank["rows"])
    for name, modes in rank["rows"].items():
        for mode in plan_graphs.MODES:
            row = modes[mode]
            assert row["host_us"] > 0 and row["eager_us"] > 0, (name, mode)
            assert row["warmup_max_us"] > 0, (name, mode, row)
    moe = next(v for k, v in rank["rows"].items() if k.startswith("moe"))
    if BACKEND == "cuda":
        assert moe["all"]["plans_as_graphs"] >= 1, moe
    assert "moe round" in plan_graphs.table(result["ranks"])
    assert pool.run(_graphs_setting)[0] == before
