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
