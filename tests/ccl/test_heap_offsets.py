"""Heap tensors at different offsets on different ranks (issue: pull and two-shot kernels
assumed one offset everywhere and silently returned zeros or a peer's other data)."""
import pytest
import torch

from .refs import BLOCK, assert_equal, rank_inputs, reduce_ref


def _in_place_all_gather(ctx):
    """NCCL-style in-place all_gather: the input is this rank's block of the output."""
    w, r = ctx.world_size, ctx.rank
    for n, alg in ((300, "pull"), (37, "pull"), (64, "pull"), (300, "push")):
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


# Byte offset of each rank's tensor in one allocation (world w, rank r). The pull kernels
# take a vector path when every peer's shift is a whole number of 16-byte vectors, and a
# scalar one otherwise (ccl/device.py: "Vector accesses"); all_gather decides per peer.
LAYOUTS = {
    "vector": lambda w, r: 16 * r,                          # shifts of 16, 32, ... bytes
    "scalar": lambda w, r: 4 * r,                           # shifts of 4, 8, ... bytes
    "mixed": lambda w, r: 16 * r + 4 * (r == w - 1),        # only the last rank is off
}


def _at_bytes(ctx, x, layout):
    """x on the heap at this rank's byte offset of `layout` (one allocation, the same size
    on every rank; the view starts `LAYOUTS[layout]` bytes in)."""
    w, size = ctx.world_size, x.element_size()
    whole = ctx.empty(x.numel() + 64 * w // size, dtype=x.dtype)
    start = LAYOUTS[layout](w, ctx.rank) // size
    t = whole[start:start + x.numel()].view(x.shape)
    t.copy_(x)
    return t, whole


def _vector_and_scalar_paths(ctx, layout):
    w, r = ctx.world_size, ctx.rank
    for i, (n, dtype, op, block) in enumerate(((301, torch.float32, "sum", BLOCK),
                                               (129, torch.bfloat16, "max", None),
                                               (64, torch.float16, "sum", 16))):
        what = f"{layout} n={n} {dtype} {op} block={block}"
        xs = rank_inputs(w, (n,), dtype, seed=31 + i)
        t, keep = _at_bytes(ctx, xs[r], layout)
        ctx.all_reduce(t, op=op, algorithm="two_shot", block=block)
        ctx.sync()
        assert_equal(t, reduce_ref(xs, op), f"two_shot {what}")

        big = rank_inputs(w, (w * n,), dtype, seed=41 + i)
        inp, keep2 = _at_bytes(ctx, big[r], layout)
        out = torch.empty(n, dtype=dtype, device=ctx.device)
        ctx.reduce_scatter(out, inp, op=op, algorithm="pull", block=block)
        ctx.sync()
        assert_equal(out, reduce_ref(big, op)[r * n:(r + 1) * n], f"rs pull {what}")

        blocks = rank_inputs(w, (n,), dtype, seed=51 + i)
        src, keep3 = _at_bytes(ctx, blocks[r], layout)
        gathered = torch.empty(w * n, dtype=dtype, device=ctx.device)
        ctx.all_gather(gathered, src, algorithm="pull", block=block)
        ctx.sync()
        assert_equal(gathered, torch.cat(blocks), f"ag pull {what}")
        for k in (keep3, keep2, keep):
            ctx.free(k)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_vector_and_scalar_paths(pool, layout):
    pool.run(_vector_and_scalar_paths, layout)
