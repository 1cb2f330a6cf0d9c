"""What a CUDA-graph capture forbids, checked without a GPU: after an eager warm-up, every
public op is called again under a fake capture (the context's `capturing()` says True)
with new tensors, so that the capture's plans are built then, as under torch.compile's
mode="reduce-overhead". Such a call must make no host collective (a barrier, a workspace
created, a debug-mode check), no synchronisation and no torch.distributed call -- any of
them invalidates a real capture -- and must still give the right result.

The paths through torch.distributed ("nccl", the fused ops' "plain") are left out: NCCL
collectives may be captured, and here they run through gloo. On GPUs the real captures
of tests/torch_ops/test_capture_all.py check the same ops.
"""
import pytest
import torch
import torch.distributed as dist

from trident.runtime import plans
from trident.ops import _common

from ..conftest import BACKEND, get_pool
from ..torch_ops import capture_cases as C

# torch.distributed's entry points that a call might use (each one is a host collective)
DIST_CALLS = ("all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
              "broadcast", "broadcast_object_list", "barrier", "reduce_scatter_tensor",
              "all_to_all_single", "send", "recv")
# fused ops whose debug-mode checks must step aside during a capture (trident/ops/_common.py)
DEBUG_SKIPPED = ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce")


class _FakeCapture:
    """Inside: ctx.capturing() is True; host collectives, syncs and torch.distributed
    calls are counted in `seen` (they still run: the ranks stay in step)."""

    def __init__(self, ctx, debug: bool):
        self.ctx, self.debug, self.seen = ctx, debug, []

    def _counting(self, what, fn):
        def counted(*args, **kwargs):
            self.seen.append(what)
            return fn(*args, **kwargs)
        return counted

    def __enter__(self):
        ctx = self.ctx
        self.saved = (ctx.capturing, ctx.plans.capturing, ctx.debug, ctx.sync,
                      torch.cuda.synchronize, {n: getattr(dist, n) for n in DIST_CALLS})
        self.step = ctx._host_step
        ctx.capturing = ctx.plans.capturing = lambda: True
        ctx.debug = self.debug
        ctx.sync = self._counting("ctx.sync", ctx.sync)
        torch.cuda.synchronize = self._counting("torch.cuda.synchronize", torch.cuda.synchronize)
        for n in DIST_CALLS:
            setattr(dist, n, self._counting(f"torch.distributed.{n}", getattr(dist, n)))
        return self

    def __exit__(self, *exc):
        ctx = self.ctx
        host = ctx._host_step - self.step
        self.seen += [f"{host} host collective(s) (barrier, workspace, debug check)"] * bool(host)
        ctx.capturing, ctx.plans.capturing, ctx.debug, sync, torch.cuda.synchronize, calls = self.saved
        del ctx.sync                       # the instance attribute: back to the method
        assert ctx.sync == sync
        for n, fn in calls.items():
            setattr(dist, n, fn)


def _fake_captures(ctx, variants):
    """Each variant: warm up eagerly, then call under a fake capture (debug mode on for
    the fused ops); returns the problems found (the same on every rank)."""
    problems = []
    for name, variant in variants:
        case = C.make_case(ctx, name, variant)
        case.fn(*case.inputs(0))
        ctx.sync()
        ctx.barrier()
        with _FakeCapture(ctx, debug=name in DEBUG_SKIPPED) as fake:
            got = case.fn(*case.inputs(1))          # new tensors: plans built "in capture"
        ctx.sync()
        C.check(got, case.expected(1), f"{name} {variant} rank {ctx.rank} (fake capture)")
        if fake.seen:
            problems.append(f"{name} {variant}: {sorted(set(fake.seen))}")
        ctx.barrier()
        case.close()
    return problems


def _first_call_in_capture(ctx):
    """A workspace that a capture would create: a clear error instead of a host barrier."""
    with _FakeCapture(ctx, debug=False) as fake, \
            pytest.raises(RuntimeError, match="warm-up"):
        _common.workspace(ctx, "capture-safety-test", 1 << 12, 64)
    assert not fake.seen, fake.seen


def _capture_twin(ctx):
    """The capture's plan that an eager first call builds on GPUs (plans.plan_for), built
    here with plans.build_twin after an eager call: a capture of the same call finds it (no build) and it
    gives the right result."""
    from trident.ops.matmul_all_reduce import _plan
    case = C.make_case(ctx, "matmul_all_reduce", "fused/classic")
    a, w, b = case.inputs(2)
    ctx.matmul_all_reduce(a, w, b, algorithm="fused")
    key = next(reversed(ctx.plans._plans))          # the eager call's plan
    assert key[0] == "matmul_all_reduce" and key[-1] is False, key
    plans.build_twin(ctx, key, lambda capture: _plan(_common._AsCaptured(ctx), a, w, b, None,
                                                     "fused", {}))
    builds = ctx.plans.builds
    with _FakeCapture(ctx, debug=False) as fake:
        got = ctx.matmul_all_reduce(a, w, b, algorithm="fused")
    ctx.sync()
    assert ctx.plans.builds == builds, "the capture did not find the twin plan"
    assert not fake.seen, fake.seen
    C.check((got,), case.expected(2), f"twin plan rank {ctx.rank}")
    ctx.barrier()


@pytest.mark.skipif(BACKEND == "cuda", reason="on GPUs, tests/torch_ops/test_capture_all.py "
                                              "captures every op for real")
def test_no_host_work_while_capturing():
    variants = [(n, v) for n, v in C.all_variants() if v not in C.NCCL_VARIANTS]
    pool = get_pool(2)
    for problems in pool.run(_fake_captures, variants):
        assert not problems, problems
    pool.run(_first_call_in_capture)
    pool.run(_capture_twin)
