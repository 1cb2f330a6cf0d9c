"""broadcast: from the first and last rank, several dtypes and odd sizes, back to back;
every rank ends with the source's tensor. The relay algorithm (ccl/broadcast/relay.py)
also from every source rank, at sizes that are not whole chunks or blocks, one element,
heap tensors at different offsets on different ranks (aligned and not to 16 bytes),
plain tensors, debug mode, and chunks set by hand (one block, not a power of two)."""
import pytest
import torch

from trident.ccl.broadcast.relay import relay
from trident.runtime.plans import Plan

from .refs import BLOCK, assert_equal, place, rank_inputs


def _broadcast_cases(ctx):
    cases = [(0, torch.bfloat16, (37,), False, BLOCK), (ctx.world_size - 1, torch.int16, (5, 3), True, None),
             (ctx.world_size // 2, torch.float32, (300,), False, None)]
    ts = []
    for i, (src, dtype, shape, sym, block) in enumerate(cases):   # back to back, no sync
        xs = rank_inputs(ctx.world_size, shape, dtype, seed=i)
        t = place(ctx, xs[ctx.rank], sym)
        ctx.broadcast(t, src=src, block=block)
        ts.append((t, xs[src]))
    ctx.sync()
    for (t, expected), case in zip(ts, cases):
        assert_equal(t, expected, f"broadcast {case}")
    with pytest.raises(ValueError, match="src must be a rank"):
        ctx.broadcast(torch.ones(3, device=ctx.device), src=ctx.world_size)


def test_broadcast(pool):
    pool.run(_broadcast_cases)


def _put(ctx, x, where, keep):
    """x on this rank: a plain tensor, a heap tensor, or a heap view whose offset differs
    by rank ("shifted3": 3 elements per rank, so peers' copies are not 16-byte apart;
    "shifted8": 8 per rank). Every rank allocates the same sizes."""
    if where == "plain":
        return x.clone().to(ctx.device)
    if where == "heap":
        t = ctx.empty(*x.shape, dtype=x.dtype)
        keep.append(t)
    else:
        pad = int(where[len("shifted"):])
        whole = ctx.empty(x.numel() + pad * ctx.world_size, dtype=x.dtype)
        keep.append(whole)
        t = whole[pad * ctx.rank: pad * ctx.rank + x.numel()].view(x.shape)
    return t.copy_(x)


# (dtype, shape, where, block, programs): words of 1, 2 and 4 bytes; sizes below one
# chunk, of one element, and not whole blocks or chunks; several chunks per program.
# fp16 "shifted1": a heap view 2 bytes off 4-byte words on odd ranks, which
# common.as_words replaces by an aligned plain buffer that the result must reach (found
# by the fuzzer); after the plain case, which made the staging buffer on every rank.
RELAY_CASES = [(torch.bfloat16, (1,), "heap", None, None),
               (torch.float32, (300,), "shifted3", BLOCK // 4, None),
               (torch.int8, (37,), "plain", 16, 3),
               (torch.float16, (100, 1), "shifted1", BLOCK, None),
               (torch.bfloat16, (7, 45), "shifted8", BLOCK, 2),
               (torch.float32, (2, 1000), "heap", None, None)]


def _relay_cases(ctx):
    w, r = ctx.world_size, ctx.rank
    keep, ts = [], []
    for src in range(w):                          # back to back, sizes changing, no sync
        for i, (dtype, shape, where, block, programs) in enumerate(RELAY_CASES):
            xs = rank_inputs(w, shape, dtype, seed=100 * src + i)
            t = _put(ctx, xs[r], where, keep)
            ctx.broadcast(t, src=src, algorithm="relay", block=block, programs=programs)
            ts.append((t, xs[src], (src, dtype, shape, where, block, programs)))
    ctx.sync()
    for t, expected, case in ts:
        assert_equal(t, expected, f"broadcast relay {case}")
    for t in keep:
        ctx.free(t)


def test_broadcast_relay(pool):
    pool.run(_relay_cases)


def _relay_debug_and_chunks(ctx):
    w, r = ctx.world_size, ctx.rank
    xs = rank_inputs(w, (129,), torch.float16, seed=5)
    t = place(ctx, xs[r], True)
    ctx.debug = True                 # the ranks' sizes are checked, the op synchronised
    try:
        ctx.broadcast(t, src=w - 1, algorithm="relay", block=BLOCK)
    finally:
        ctx.debug = False
    assert_equal(t, xs[w - 1], "broadcast relay, debug mode")
    # chunks by hand: one block (many iterations per program), not a power of two
    for i, (chunk, block) in enumerate(((16, 16), (48, 16), (128, 64))):
        xs = rank_inputs(w, (501,), torch.float32, seed=20 + i)
        t = place(ctx, xs[r], True)
        src = i % w
        plan = Plan((t,), "relay")
        relay(ctx, plan, t.view(torch.int32), src, block=block, chunk=chunk)
        plan.finish()
        plan.run((t,))
        ctx.sync()
        assert_equal(t, xs[src], f"broadcast relay chunk={chunk} block={block}")
        ctx.free(t)
    with pytest.raises(ValueError, match="chunk must be a positive multiple"):
        relay(ctx, Plan(), torch.zeros(64, dtype=torch.int32, device=ctx.device), 0, block=16,
              chunk=24)


def test_broadcast_relay_debug_and_chunks(pool):
    pool.run(_relay_debug_and_chunks)
