"""Mistakes that used to break a context for good, or gave a misleading message."""
import pytest
import torch

import trident as td


def _mismatched_first_call(pool_ctx):
    """Ranks ask for different workspace sizes on an op's first call (debug off): every
    rank raises, names the workspace, and the context works afterwards. A fresh context,
    so that no earlier test made one of the workspaces already."""
    with td.init(heap_size=16 << 20, group=pool_ctx.group) as ctx:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(24, 32, generator=g).to(torch.bfloat16).to(ctx.device)
        a_bad = torch.randn(4 + 60 * ctx.rank, 32, generator=g).to(torch.bfloat16)
        with pytest.raises((td.HeapMismatchError, RuntimeError), match="workspace"):
            ctx.all_gather_matmul(a_bad.to(ctx.device), w, algorithm="fused")
        a = torch.randn(4, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
        out = ctx.all_gather_matmul(a.to(ctx.device), w, algorithm="fused")
        ctx.sync()
        expected = torch.cat([a] * ctx.world_size).float() @ w.float().cpu().T
        torch.testing.assert_close(out.float().cpu(), expected, rtol=2e-2, atol=1e-1)
        ctx.barrier()


def test_mismatched_first_call_leaves_context_usable(pool):
    if pool.world_size == 1:
        pytest.skip("needs two ranks: one rank cannot disagree with itself")
    pool.run(_mismatched_first_call)


def _small_mistakes(ctx):
    t = ctx.zeros(16)
    ctx.free(t)
    with pytest.raises(ValueError, match="double free"):
        ctx.free(t)
    with pytest.raises(ValueError, match="src must be a rank"):
        ctx.broadcast(torch.zeros(4, device=ctx.device), src=True)


def test_small_mistakes(pool):
    pool.run(_small_mistakes)
