"""broadcast, every algorithm of the registry: from the first, a middle and the last
rank, several dtypes and odd sizes, back to back; every rank ends with the source's
tensor. The relay algorithm (ccl/broadcast/relay.py) also from every source rank, at
sizes that are not whole chunks or blocks, one element, heap tensors at different offsets
on different ranks (aligned and not to 16 bytes), plain tensors, debug mode, and chunks
set by hand (one block, not a power of two). The lamport algorithm
(ccl/broadcast/lamport.py, LL units) from every root, bit for bit, with its rounds shared
with the other Lamport kernels, and its capacity."""
import numpy as np
import pytest
import torch

from trident.ccl import lamport
from trident.ccl.broadcast.relay import relay
from trident.runtime.plans import Plan

from .. import algorithms
from .refs import BLOCK, assert_equal, place, rank_inputs


def _broadcast_cases(ctx, names):
    """The cases below with each algorithm of `names` (None: the selector's choice)."""
    cases = [(0, torch.bfloat16, (37,), False, BLOCK), (ctx.world_size - 1, torch.int16, (5, 3), True, None),
             (ctx.world_size // 2, torch.float32, (300,), False, None)]
    ts = []
    for alg in names:
        for i, (src, dtype, shape, sym, block) in enumerate(cases):   # back to back, no sync
            xs = rank_inputs(ctx.world_size, shape, dtype, seed=i)
            t = place(ctx, xs[ctx.rank], sym)
            ctx.broadcast(t, src=src, algorithm=alg, block=block)
            ts.append((t, xs[src], (alg, src, dtype, shape, sym, block)))
    ctx.sync()
    for t, expected, case in ts:
        assert_equal(t, expected, f"broadcast {case}")
    with pytest.raises(ValueError, match="src must be a rank"):
        ctx.broadcast(torch.ones(3, device=ctx.device), src=ctx.world_size)
    # a rank that is not a Python int (a numpy int, a 0-d tensor): a TypeError that says
    # so, not "src must be a rank in 0..w-1, got np.int64(0)"
    for src in (np.int64(0), torch.tensor(0)):
        with pytest.raises(TypeError, match=rf"broadcast: src must be an int \(a rank in "
                                            rf"0..{ctx.world_size - 1}\), got "
                                            rf"{type(src).__name__} .*; pass int\(src\)"):
            ctx.broadcast(torch.ones(3, device=ctx.device), src=src)


def test_broadcast(pool):
    """Every algorithm of the registry (tests/algorithms.py) and the selector's choice."""
    pool.run(_broadcast_cases, algorithms.kernels("broadcast") + [None])


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


# (dtype, shape, on the heap, block, programs): words of 1, 2 and 4 bytes (int8 of odd
# sizes: int8 words, packed four to an LL unit), one element, several programs and steps
LAMPORT_CASES = [(torch.bfloat16, (37,), False, 16, 3), (torch.int8, (5, 3), True, None, None),
                 (torch.float32, (300,), True, 64, 2), (torch.bool, (7,), False, None, None),
                 (torch.int64, (11, 2), False, 16, None), (torch.float16, (1,), True, None, 1),
                 (torch.uint8, (129,), False, 4, 5)]


def _lamport_rounds(ctx):
    """Every root, every case, back to back without a sync, interleaved with the other
    Lamport kernels (their rounds and buffers are the context's: ccl/lamport.py, "Rounds")
    and once with a flag-protocol broadcast; every rank's tensor equal to the root's bit
    for bit. Then the bit patterns a Lamport sentinel reserves travel unchanged."""
    w, me = ctx.world_size, ctx.rank
    calls, keep = [], []
    for src in range(w):
        for i, (dtype, shape, sym, block, programs) in enumerate(LAMPORT_CASES):
            xs = rank_inputs(w, shape, dtype, seed=300 + 10 * src + i)
            t = place(ctx, xs[me], sym)
            if sym:
                keep.append(t)
            ctx.broadcast(t, src=src, algorithm="lamport", block=block, programs=programs)
            calls.append((t, xs[src], (src, dtype, shape, sym, block, programs)))
            if i == 2:
                a = place(ctx, rank_inputs(w, (33,), torch.float32, seed=700 + src)[me], False)
                ctx.all_reduce(a, algorithm="lamport", block=16)
                out = torch.empty(w * 9, dtype=torch.int16, device=ctx.device)
                ctx.all_gather(out, torch.full((9,), me, dtype=torch.int16, device=ctx.device),
                               algorithm="lamport")
                calls.append((out, torch.arange(w, dtype=torch.int16).repeat_interleave(9),
                              "all_gather lamport in between"))
            if i == 4 and src == 0:
                t = place(ctx, rank_inputs(w, (40,), torch.float32, seed=800)[me], False)
                ctx.broadcast(t, src=w - 1, algorithm="push")
                calls.append((t, rank_inputs(w, (40,), torch.float32, seed=800)[w - 1],
                              "push in between"))
    ctx.sync()
    for t, want, case in calls:
        assert torch.equal(t.cpu().view(torch.uint8), want.view(torch.uint8)), \
            f"broadcast lamport {case}: {t} != {want}"
    odd = torch.tensor([0x80008000, 0x80000000, 0x00008000, 0x7FC00001, 0xFFFFFFFF],
                       dtype=torch.int64).to(torch.int32) + me
    for dtype in (torch.float32, torch.bfloat16, torch.uint8):
        t = odd.view(dtype).clone().to(ctx.device)
        ctx.broadcast(t, src=w - 1, algorithm="lamport")
        want = (odd - me + w - 1).view(dtype)
        assert torch.equal(t.cpu().view(torch.uint8), want.view(torch.uint8)), (dtype, t)
    for t in keep:
        ctx.free(t)


def test_broadcast_lamport(pool):
    pool.run(_lamport_rounds)


def _lamport_capacity(ctx):
    """Past its capacity (half a slot: LL units) every rank raises ValueError, naming the
    limit and the algorithms to use; at the limit the tensor arrives."""
    if ctx.world_size == 1:
        return
    cap = lamport.limit(ctx, "broadcast")
    with pytest.raises(ValueError, match=f"broadcast algorithm 'lamport' takes at most {cap} "
                                         r"bytes .* use 'push' or 'relay'"):
        ctx.broadcast(torch.ones(cap // 4 + 1, device=ctx.device), src=0, algorithm="lamport")
    xs = rank_inputs(ctx.world_size, (cap // 2,), torch.int16, seed=9)
    t = xs[ctx.rank].to(ctx.device)
    ctx.broadcast(t, src=1, algorithm="lamport")
    ctx.sync()
    assert torch.equal(t.cpu(), xs[1])


def test_broadcast_lamport_capacity(pool):
    pool.run(_lamport_capacity)
