"""Lamport broadcast in LL units: the root stores its tensor into its slot of every peer's
receive buffer as 8-byte units, 4 bytes of payload beside a 4-byte flag (the round), and
each other rank copies the units into its tensor as soon as their flags say this round
(ccl/lamport.py, "LL units"); the root copies nothing.

It moves what push moves, (world-1)*n out of the root, twice that on the wire (half of
each unit is flag), in one kernel and one NVLink trip, without push's release fence, flag
round and ARRIVE exchange, so it is the latency path for small tensors (at most half of
`ccl.lamport.capacity` bytes: 512 KiB with the default heap); push and relay win once
bandwidth matters. Any dtype, bit for bit.

Program p of every rank sends its head (the round and the call's fingerprint: size, word,
root) to every peer, and waits for every peer's (ccl/lamport.py `receive_head`): so a
rank whose call differs (another root or size) is CallMismatch on every rank, and no rank
starts round e + 1 before every peer entered round e (the rounds' rule, which the root
would otherwise break: nothing else holds it back). A non-root's tensor is poisoned (all
bits set: NaN for floats) where a wait failed; the root's is its input, left as it is.
"""
import torch
import triton
import triton.language as tl

from trident.trace import device as trd, tags

from .. import lamport as proto, lamport_ll as ll
from ..device import OP_BROADCAST, poison


@triton.jit
def _lamport_kernel(t, count, src, data, heads, lsync, fsync, ctrl, heap_bases, trace_buf,
                    rank, n, slot, fp, WORLD: tl.constexpr, WORD: tl.constexpr,
                    BLOCK: tl.constexpr, TRACE: tl.constexpr, PDL: tl.constexpr):
    # count: the tensor's words (of WORD bytes); n: its lanes (4 bytes, one LL unit each)
    t0 = trd.begin(TRACE)
    epoch, buf, base, expect = proto.open_round(data, lsync, slot, fp, WORLD, PDL)
    flag = ll.ll_flag(epoch)
    pid, programs = tl.program_id(0), tl.num_programs(0)
    if rank == src:
        for blk in range(pid, tl.cdiv(n, BLOCK), programs):
            offs = blk * BLOCK + tl.arange(0, BLOCK)
            units = ll.ll_units(ll.pack(t, offs, count, WORD), flag)
            proto.send(base + rank * slot, units, offs, offs < n, rank, heap_bases, WORLD)
    heads_row, ok, t0 = proto.sent(heads, buf, expect, rank, heap_bases, trace_buf, t0, WORLD,
                                   TRACE)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    for i in tl.static_range(1, WORLD):      # the heads of the peers that send no units
        peer = (rank + i) % WORLD
        if peer != src:
            ok = proto.receive_head(base, slot, heads_row, peer, offs, flag, expect, ok, ctrl,
                                    fsync, rank, heap_bases, WORLD, OP_BROADCAST)
    if rank != src:
        for blk in range(pid, tl.cdiv(n, BLOCK), programs):
            offs = blk * BLOCK + tl.arange(0, BLOCK)
            lanes, ok = proto.receive_ll(base, slot, heads_row, src, offs, offs < n, flag,
                                         expect, ok, ctrl, fsync, rank, heap_bases, WORLD,
                                         OP_BROADCAST)
            ll.unpack(t, poison(lanes, ok), offs, count, WORD)
    proto.clear_heads(heads_row, rank, WORLD)
    proto.end(lsync, epoch)
    trd.end(trace_buf, t0, tags.COPY, rank, TRACE)


def fits(ctx, nbytes: int) -> bool:
    """Whether a tensor of `nbytes` is within what this context's Lamport buffers take
    (registry.py: "auto" passes over it otherwise)."""
    return nbytes <= proto.limit(ctx, "broadcast")


def lamport(ctx, plan, t, src: int, block=None, programs=None, warps=None):
    """t: a flat word view (checked by the caller). warps: a knob (common.py)."""
    count, word = t.numel(), t.element_size()
    proto.check(ctx, "broadcast", t.dtype, count * word, "", "'push' or 'relay'",
                floats=False)
    proto.launch(ctx, plan, _lamport_kernel, (t, count, src), torch.int64,
                 triton.cdiv(count * word, 4), (count, word, src), block, programs, warps,
                 WORD=word)
