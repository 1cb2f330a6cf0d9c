"""Heap tensors at different offsets on different ranks (issue: pull and two-shot kernels
assumed one offset everywhere and silently returned zeros or a peer's other data)."""
import torch

from .refs import BLOCK, assert_equal, rank_inputs, reduce_ref


def _in_place_all_gather(ctx):
    """NCCL-style in-place all_gather: the input is this rank's block of the output."""
    w, r = ctx.world_size, ctx.rank
    for n, alg in ((300, "pull"), (37, "pull"), (300, "push")):
        blocks = rank_inputs(w, (n,), torch.bfloat16, seed=n)
        out = ctx.zeros(w * n, dtype=torch.bfloat16)
        mine = out[r * n:(r + 1) * n]
        mine.copy_(blocks[r])
        ctx.all_gather(out, mine, algorithm=alg, block=BLOCK)
        ctx.sync()
        assert_equal(out, torch.cat(blocks), f"in-place all_gather {alg} n={n}")
        ctx.free(out)


def _shifted(ctx, x):
    """x on the heap at a different offset on every rank: a view into the same allocation
    (allocations must match across ranks; views need not)."""
    whole = ctx.empty(x.numel() + 16 * ctx.world_size, dtype=x.dtype)
    t = whole[ctx.rank * 8: ctx.rank * 8 + x.numel()].view(x.shape)
    t.copy_(x)
    return t, whole


def _reductions_at_different_offsets(ctx):
    w, r = ctx.world_size, ctx.rank
    for n, dtype in ((300, torch.float32), (129, torch.bfloat16)):
        xs = rank_inputs(w, (n,), dtype, seed=7 + n)
        t, keep = _shifted(ctx, xs[r])
        ctx.all_reduce(t, algorithm="two_shot", block=BLOCK)
        ctx.sync()
        assert_equal(t, reduce_ref(xs, "sum"), f"two_shot n={n} {dtype}")

        big = rank_inputs(w, (w * n,), dtype, seed=9 + n)
        inp, keep2 = _shifted(ctx, big[r])
        out = torch.empty(n, dtype=dtype, device=ctx.device)
        ctx.reduce_scatter(out, inp, algorithm="pull", block=BLOCK)
        ctx.sync()
        assert_equal(out, reduce_ref(big, "sum")[r * n:(r + 1) * n], f"rs pull n={n} {dtype}")
        ctx.free(keep2)
        ctx.free(keep)


def test_in_place_all_gather(pool):
    pool.run(_in_place_all_gather)


def test_reductions_at_different_offsets(pool):
    pool.run(_reductions_at_different_offsets)
