"""`as_shared_gpu(ctx)`: a CPU-emulation context made to look like GPU ranks that share a
GPU (ranks_per_device > 1, so shares_device, and nccl_available False), for the tests
of what trident does without NCCL (tests/ccl/test_no_nccl.py, tests/test_bench_shared_gpu.py).

Inside a rank function: `with as_shared_gpu(ctx): ...`. An attribute that Context
defines as a property is replaced on the class for the duration (the rank process runs
one function at a time), a plain one on the instance; both are put back after, and the
context's plans are dropped on the way in and out, so that no plan built in one mode is
reused in the other.
"""
import contextlib

RANKS_PER_GPU = 2
_MISSING = object()


@contextlib.contextmanager
def as_shared_gpu(ctx, ranks_per_gpu: int = RANKS_PER_GPU):
    forced = {"ranks_per_device": ranks_per_gpu, "shares_device": True,
              "nccl_available": False}
    saved = []
    ctx.plans.clear()
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
        for holder, name, value in reversed(saved):
            if value is _MISSING:
                delattr(holder, name)
            else:
                setattr(holder, name, value)
        ctx.plans.clear()
