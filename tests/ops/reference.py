"""Inputs and fp32 references shared by the tests of trident.ops.

Every rank builds the same global tensors from one seed, takes its shard, and checks the
op's result against plain torch in fp32 on the gathered inputs.
"""
import pytest
import torch

from trident.tools import testing


def make(shape, seed, dtype, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(device)


def refused_without_nccl(ctx, algorithm, call) -> bool:
    """Where ranks share a GPU, NCCL (the "plain"/"nccl" path) is unavailable: check that
    `call()` refuses with the error that says so and return True (nothing to compare);
    False where the path can run."""
    if algorithm not in ("plain", "nccl") or ctx.nccl_available:
        return False
    with pytest.raises(ValueError, match="share one GPU"):
        call()
    return True


def assert_close(out, ref, what, rel=2e-2):
    """bf16/fp16 output against an fp32 reference: relative Frobenius error below `rel` and
    every element within 4 * rel of the reference's largest magnitude (trident.tools.testing)."""
    ref = ref.float().cpu()
    testing.assert_close(out, ref, 4 * rel * ref.abs().max().clamp_min(1e-6), what, rel)
