"""The MoE kernels are launched with programmatic dependent launch where the GPU has it
(sm_90+: moe/plans.py "PDL", options from ccl/common.py pdl_options) and plainly
elsewhere: every launch of a round's plans (both paths, fused and split: every PART)
carries its PDL constexpr and launch_pdl together, never launch_pdl on the CPU
emulation, and the knob off (plans.PDL = False, bench/lab/kernel_times.py's A/B)
launches them plainly. That a kernel with PDL waits before any global access is the
sm_90 compile check's (tests/compile/sm90.py)."""
import types

import pytest
import torch

import trident as td
from trident.ccl.common import pdl_options
from trident.moe import plans
from trident.runtime.triton_launch import Launch

from ..conftest import pool_worlds
from .test_expert_parallel import _round_inputs

POOL_WORLDS = pool_worlds([2])


@pytest.mark.parametrize("major, on, launched", [(9, True, True), (10, True, True),
                                                 (8, True, False), (9, False, False)])
def test_pdl_options(monkeypatch, major, on, launched):
    """launch_pdl (and PDL=True) on a GPU of sm_90 or later with the knob on, else PDL=False
    and no launch_pdl; never on the CPU emulation."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (major, 0))
    gpu = types.SimpleNamespace(backend="cuda", device=torch.device("cuda", 0))
    want = {"PDL": True, "launch_pdl": True} if launched else {"PDL": False}
    assert pdl_options(gpu, on) == want
    cpu = types.SimpleNamespace(backend="cpu", device=torch.device("cpu"))
    assert pdl_options(cpu, on) == {"PDL": False}


def _pdl_of(launch: Launch) -> tuple:
    """(kernel, its PDL constexpr, launch_pdl) of one launch."""
    if launch.fast is None:     # the ordinary path (CPU emulation) keeps the arguments
        constexpr = launch.args[launch.kernel.arg_names.index("PDL")]
    else:                       # a compiled kernel: its code waits iff PDL
        constexpr = "griddepcontrol.wait" in launch.compiled.asm["ptx"]
    return launch.kernel.fn.__name__, bool(constexpr), bool(launch.kwargs.get("launch_pdl"))


def _round_launches(ctx, high_throughput: bool, knob: bool):
    """One fused and one split round with plans.PDL = knob on fresh plans: (whether PDL is
    expected, the MoE launches of their plans as _pdl_of gives them)."""
    was = plans.PDL
    plans.PDL = knob
    ctx.plans.clear()
    E, k, H, M, dtype = 2 * ctx.world_size, 2, 32, 4, torch.bfloat16
    ep = td.ExpertParallel(ctx, E, k, H, M, dtype=dtype, high_throughput=high_throughput)
    try:
        ranks, _, _ = _round_inputs(3, ctx.world_size, E, k, H, M, dtype, [M] * ctx.world_size)
        _, x, idx, w = ranks[ctx.rank]
        x, idx, w = x.to(ctx.device), idx.to(ctx.device), w.to(ctx.device)
        d = ep.dispatch(x, idx)
        ep.combine(d.expert_x, d, w)
        d = ep.dispatch(x, idx, wait=False).wait()
        ep.combine(d.expert_x, d, w, wait=False).wait()
        ctx.sync()
        seen = [_pdl_of(s) for plan in ctx.plans._plans.values() for s in plan.steps
                if isinstance(s, Launch) and s.kernel.fn.__module__.startswith("trident.moe")]
        want = (knob and ctx.backend == "cuda"
                and torch.cuda.get_device_capability(ctx.device)[0] >= 9)
        return want, seen
    finally:
        plans.PDL = was
        ctx.plans.clear()
        ep.close()


def _both_knobs(ctx, high_throughput: bool):
    return [_round_launches(ctx, high_throughput, knob) for knob in (True, False)]


@pytest.mark.parametrize("high_throughput", [False, True])
def test_every_moe_launch_has_pdl_where_the_gpu_has_it(pool, high_throughput):
    for rank, results in enumerate(pool.run(_both_knobs, high_throughput)):
        for want, seen in results:
            # dispatch and combine, fused (PART BOTH) and split (SEND, then RECV)
            assert len(seen) >= 6, (rank, seen)
            assert {name for name, _, _ in seen} == (
                {"ht_dispatch_kernel", "ht_combine_kernel"} if high_throughput
                else {"dispatch_kernel", "combine_kernel"}), (rank, seen)
            assert all(pdl == want and launched == want for _, pdl, launched in seen), \
                (rank, want, seen)
