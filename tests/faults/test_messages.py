"""Mistakes that the ranks detect together, without a timeout: each names the op, and the
context (and the shared rank pool) stays usable afterwards."""
import pytest
import torch

import trident as td
from trident.runtime.errors import CallMismatch


def _different_ops_debug(ctx):
    """Debug mode: rank 0 calls all_reduce while the others call all_gather."""
    ctx.debug = True
    try:
        t = ctx.ones(64)
        out = ctx.empty(64 * ctx.world_size)
        with pytest.raises(CallMismatch, match="rank 0 called all_reduce") as info:
            if ctx.rank == 0:
                ctx.all_reduce(t)
            else:
                ctx.all_gather(out, t)
        assert "rank 1 called all_gather" in str(info.value)
        # one family (issue 41): a host-side mismatch is the device-side's class, a CommTimeout
        assert isinstance(info.value, td.CommTimeout)
        assert info.value.op == ("all_reduce" if ctx.rank == 0 else "all_gather")
        ctx.all_reduce(t)                  # in step again
        ctx.barrier()
        assert torch.equal(t, torch.full_like(t, ctx.world_size))
    finally:
        ctx.debug = False


def test_different_ops_in_debug_mode_are_named(pool):
    if pool.world_size == 1:
        pytest.skip("needs two ranks: one rank cannot make a different call from itself")
    pool.run(_different_ops_debug)


def _uneven_k_shards_debug(ctx):
    """Row-parallel ops with a different K shard per rank are valid maths: debug mode
    must not reject them."""
    world, rank = ctx.world_size, ctx.rank
    ks = [8 + 8 * r for r in range(world)]
    m, n = 4 * world, 16
    g = torch.Generator().manual_seed(7)
    a_full = torch.randn(m, sum(ks), generator=g).to(torch.bfloat16)
    w_full = torch.randn(n, sum(ks), generator=g).to(torch.bfloat16)
    cols = slice(sum(ks[:rank]), sum(ks[:rank + 1]))
    a, w = (t[:, cols].contiguous().to(ctx.device) for t in (a_full, w_full))
    ref = a_full.float() @ w_full.float().T
    ctx.debug = True
    try:
        rs = ctx.matmul_reduce_scatter(a, w, algorithm="fused")
        ar = ctx.matmul_all_reduce(a, w, algorithm="fused")
    finally:
        ctx.debug = False
    torch.testing.assert_close(rs.float().cpu(), ref.chunk(world)[rank], rtol=2e-2, atol=2e-1)
    torch.testing.assert_close(ar.float().cpu(), ref, rtol=2e-2, atol=2e-1)


def test_uneven_k_shards_pass_debug_mode(pool):
    pool.run(_uneven_k_shards_debug)


def _workspace_that_does_not_fit(ctx):
    """A nearly full heap: an op's first call needs a workspace that does not fit. The
    error names the op, the size and how to make the heap larger; after freeing, it works."""
    with td.init(heap_size=1 << 20, group=ctx.group) as small:
        filler = small.empty((1 << 20) - (64 << 10), dtype=torch.uint8)
        rows = 256 // ctx.world_size      # the gathered A (the workspace): 128 KiB at any world
        a = torch.randn(rows, 256, dtype=torch.bfloat16, device=ctx.device)
        w = torch.randn(32, 256, dtype=torch.bfloat16, device=ctx.device)
        with pytest.raises(td.HeapFullError) as info:
            small.all_gather_matmul(a, w, algorithm="fused")
        text = str(info.value)
        assert "all_gather_matmul needs the workspace" in text, text
        assert "heap_size=" in text and "TRIDENT_HEAP_SIZE" in text, text
        small.free(filler)
        out = small.all_gather_matmul(a, w, algorithm="fused")
        small.barrier()
        assert out.shape == (rows * ctx.world_size, 32)


def test_workspace_that_does_not_fit_names_the_op(pool):
    pool.run(_workspace_that_does_not_fit)


def _empty_k_shard(ctx):
    """Row-parallel ops where one rank's K shard is empty (K = 0): valid maths (that rank
    adds zeros), so it must work on every rank -- rejecting it on that rank alone left the
    others waiting for it until their timeout."""
    world, rank = ctx.world_size, ctx.rank
    ks = [0] + [8 * r for r in range(1, world)]
    m, n = 4 * world, 16
    g = torch.Generator().manual_seed(3)
    a_full = torch.randn(m, sum(ks), generator=g).to(torch.bfloat16)
    w_full = torch.randn(n, sum(ks), generator=g).to(torch.bfloat16)
    cols = slice(sum(ks[:rank]), sum(ks[:rank + 1]))
    a, w = (t[:, cols].contiguous().to(ctx.device) for t in (a_full, w_full))
    ref = a_full.float() @ w_full.float().T
    paths = [("fused", "classic"), ("fused", "tma")] + [("plain", None)] * ctx.nccl_available
    for algorithm, gemm in paths:
        kw = {} if gemm is None else {"gemm": gemm}
        rs = ctx.matmul_reduce_scatter(a, w, algorithm=algorithm, **kw)
        ar = ctx.matmul_all_reduce(a, w, algorithm=algorithm, **kw)
        what = f"{algorithm} {gemm}"
        torch.testing.assert_close(rs.float().cpu(), ref.chunk(world)[rank], rtol=2e-2,
                                   atol=2e-1, msg=lambda e: f"{what} rs: {e}")
        torch.testing.assert_close(ar.float().cpu(), ref, rtol=2e-2, atol=2e-1,
                                   msg=lambda e: f"{what} ar: {e}")
    ctx.sync()


def test_empty_k_shard_on_one_rank(pool):
    pool.run(_empty_k_shard)
