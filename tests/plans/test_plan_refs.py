"""A cached launch plan keeps the addresses of a call's own tensors, never the tensors
(trident/runtime/triton_launch.py, Launch.keep): a caller's input must die when the caller drops
it, or every new activation would stay alive in the plan cache (up to its 512 plans) and
torch.compile's CUDA-graph pool would find tensors it does not track. On GPUs only: the
CPU emulation's launches keep their arguments by design."""
import gc
import weakref

import pytest
import torch

from trident.runtime.launch import default_backend

pytestmark = pytest.mark.skipif(default_backend() != "cuda",
                                reason="the CPU emulation's launches keep their arguments")


def _dies(make, call) -> list[str]:
    """Names of the tensors that `call(*tensors)` kept alive after the caller let go."""
    tensors = make()
    refs = {name: weakref.ref(t) for name, t in tensors.items()}
    call(**tensors)
    torch.cuda.synchronize()
    del tensors
    gc.collect()
    return [name for name, r in refs.items() if r() is not None]


def _check(ctx):
    from trident import ExpertParallel
    dev, w, bad = ctx.device, ctx.world_size, {}
    bad["all_reduce"] = _dies(lambda: dict(t=torch.randn(1000, device=dev)),
                              lambda t: ctx.all_reduce(t))
    bad["all_gather"] = _dies(
        lambda: dict(out=torch.empty(w * 100, device=dev), inp=torch.randn(100, device=dev)),
        lambda out, inp: ctx.all_gather(out, inp))
    bad["matmul_all_reduce"] = _dies(
        lambda: dict(a=torch.randn(64, 128, device=dev, dtype=torch.bfloat16),
                     b=torch.randn(96, 128, device=dev, dtype=torch.bfloat16)),
        lambda a, b: ctx.matmul_all_reduce(a, b, algorithm="fused"))
    ep = ExpertParallel(ctx, 2 * w, 2, 128, 16, dtype=torch.bfloat16)
    keep = {}

    def dispatch(x, idx):
        keep["d"] = ep.dispatch(x, idx)

    bad["moe_dispatch"] = _dies(
        lambda: dict(x=torch.randn(8, 128, device=dev, dtype=torch.bfloat16),
                     idx=torch.stack([torch.randperm(2 * w, device=dev)[:2] for _ in range(8)])),
        dispatch)
    bad["moe_combine"] = _dies(
        lambda: dict(y=keep["d"].expert_x * 2, wts=torch.rand(8, 2, device=dev)),
        lambda y, wts: ep.combine(y, keep["d"], wts))
    ctx.sync()
    ep.close()
    return {op: names for op, names in bad.items() if names}


def test_plans_keep_no_caller_tensor_alive(pool):
    for rank, bad in enumerate(pool.run(_check)):
        assert not bad, f"rank {rank}: plans kept these inputs alive: {bad}"
