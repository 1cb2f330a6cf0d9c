"""`as_shared_gpu(ctx)`: a CPU-emulation context made to look like GPU ranks that share a
GPU (ranks_per_device > 1, so shares_device, and nccl_available False), for the tests
of what trident does without NCCL (tests/ccl/test_no_nccl.py, tests/test_bench_shared_gpu.py).

Inside a rank function: `with as_shared_gpu(ctx): ...`. An attribute that Context
defines as a property is replaced on the class for the duration (the rank process runs
one function at a time), a plain one on the instance; both are put back after, and the
context's plans are dropped on the way in and out, so that no plan built in one mode is
reused in the other. The facts the ranks agreed at their first collective
(trident.ccl.common.Agreed) say NCCL cannot run for the duration, then what they said
before: the first collective may come inside (the facts are made once per context), and
a context that agreed "no NCCL" there would refuse it for good. Every rank must enter and
leave together (entering agrees the facts if no collective has yet).
"""
import contextlib

RANKS_PER_GPU = 2
_MISSING = object()


@contextlib.contextmanager
def as_shared_gpu(ctx, ranks_per_gpu: int = RANKS_PER_GPU):
    forced = {"ranks_per_device": ranks_per_gpu, "shares_device": True,
              "nccl_available": False}
    from trident.ccl import common
    saved = []
    ctx.plans.clear()
    facts = common.agreed(ctx)
    was_nccl, facts.nccl = facts.nccl, False
    try:
        for name, value in forced.items():
            owner = next((k for k in type(ctx).__mro__ if name in k.__dict__), None)
            if owner is not None and isinstance(owner.__dict__[name], property):
                saved.append((owner, name, owner.__dict__[name]))
                setattr(owner, name, value)
            else:
                saved.append((ctx, name, ctx.__dict__.get(name, _MISSING)))
                setattr(ctx, name, value)
        yield ctx
    finally:
        facts.nccl = was_nccl
        for holder, name, value in reversed(saved):
            if value is _MISSING:
                delattr(holder, name)
            else:
                setattr(holder, name, value)
        ctx.plans.clear()
