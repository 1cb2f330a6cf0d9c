"""GPUs: building a plan that replays as a CUDA graph (TRIDENT_PLAN_GRAPHS=multi, the
default: a plain tensor's all_reduce is copy in, kernel, copy out) neither synchronizes
the device nor empties torch's caching allocator. torch.cuda.graph(...) does both before
every capture; a plan is built on each new key -- each new address of a plain tensor --
so the torch backend's TP MLP step paid a device sync per step and its freed blocks went
back to CUDA (docs/torch-backend.md). On the CPU emulation there are no graphs: skipped."""
import pytest
import torch

from ..conftest import BACKEND

pytestmark = pytest.mark.skipif(BACKEND != "cuda", reason="CUDA graphs need a GPU")


def _build_keeps_the_cache(ctx):
    from trident import plans as P
    dev = ctx.device
    # a cached block: allocated, freed, kept by the caching allocator
    block = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    del block
    reserved = torch.cuda.memory_reserved(dev)
    t = torch.full((3001,), float(ctx.rank + 1), device=dev)     # a new key: a plain tensor
    captured = []
    real = P._capture
    P._capture = lambda steps, tensors: captured.append(1) or real(steps, tensors)
    try:
        ctx.all_reduce(t)
    finally:
        P._capture = real
    torch.cuda.synchronize(dev)
    w = ctx.world_size
    right = bool((t == w * (w + 1) / 2).all())
    return right, len(captured), torch.cuda.memory_reserved(dev) >= reserved


def test_a_plan_build_keeps_the_allocators_cache(pool):
    if pool.world_size < 2:
        pytest.skip("a plain tensor's plan has several steps only where ranks exchange")
    for rank, (right, captures, kept) in enumerate(pool.run(_build_keeps_the_cache)):
        assert right, f"rank {rank}: wrong sum"
        assert captures >= 1, f"rank {rank}: no plan was captured as a graph (nothing checked)"
        assert kept, f"rank {rank}: building the plan emptied the caching allocator"
