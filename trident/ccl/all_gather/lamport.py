"""Lamport all-gather in LL units: every rank stores its block into its slot of every peer's
receive buffer as 8-byte units, 4 bytes of payload beside a 4-byte flag (the round), and
each rank copies every peer's units into its output as soon as their flags say this round
(ccl/lamport.py, "LL units": the flag travels in the same store as its payload).

It moves (world-1)*n per rank, twice that on the wire (half of each unit is flag), in one
kernel and one NVLink trip, without push's release fence and flag round, so it is the
latency path for small blocks (at most half of `ccl.lamport.capacity` per rank: 512 KiB
with the default heap); push and pull win once bandwidth matters. Any dtype, bit for bit:
unlike the Lamport sentinel, the flag is a word of its own, so no payload value is
reserved (-0.0, the fp32 denormal 0x80008000 and NaNs arrive as they were sent). A failed
wait poisons the peer's block (all bits set: NaN for floats).
"""
import torch
import triton
import triton.language as tl

from trident.trace import device as trd, tags

from .. import lamport as proto, lamport_ll as ll
from ..device import OP_ALL_GATHER, poison


@triton.jit
def _lamport_kernel(out, inp, count, data, heads, lsync, fsync, ctrl, heap_bases, trace_buf,
                    rank, n, slot, fp, WORLD: tl.constexpr, WORD: tl.constexpr,
                    BLOCK: tl.constexpr, TRACE: tl.constexpr, PDL: tl.constexpr):
    # count: the words (of WORD bytes) a rank gives; n: its lanes (4 bytes, one LL unit each)
    t0 = trd.begin(TRACE)
    epoch, buf, base, expect = proto.open_round(data, lsync, slot, fp, WORLD, PDL)
    flag = ll.ll_flag(epoch)
    pid, programs = tl.program_id(0), tl.num_programs(0)
    for blk in range(pid, tl.cdiv(n, BLOCK), programs):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        lanes = ll.pack(inp, offs, count, WORD)
        proto.send(base + rank * slot, ll.ll_units(lanes, flag), offs, mask, rank,
                   heap_bases, WORLD)
        ll.unpack(out + rank * count, lanes, offs, count, WORD)     # my own block
    heads_row, ok, t0 = proto.sent(heads, buf, expect, rank, heap_bases, trace_buf, t0, WORLD,
                                   TRACE)
    for blk in range(pid, tl.cdiv(n, BLOCK), programs):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        for i in tl.static_range(1, WORLD):
            src = (rank + i) % WORLD
            lanes, ok = proto.receive_ll(base, slot, heads_row, src, offs, mask, flag, expect,
                                         ok, ctrl, fsync, rank, heap_bases, WORLD,
                                         OP_ALL_GATHER)
            ll.unpack(out + src * count, poison(lanes, ok), offs, count, WORD)
    proto.clear_heads(heads_row, rank, WORLD)
    proto.end(lsync, epoch)
    trd.end(trace_buf, t0, tags.COPY, rank, TRACE)


def fits(ctx, nbytes: int) -> bool:
    """Whether `nbytes` per rank (the selector's measure) is within what this context's
    Lamport buffers take (registry.py: "auto" passes over it otherwise)."""
    return nbytes <= proto.limit(ctx, "all_gather")


def lamport(ctx, plan, out, inp, block=None, programs=None, warps=None):
    """out, inp: flat word views (checked by the caller); out has world * inp.numel()."""
    count, word = inp.numel(), inp.element_size()
    proto.check(ctx, "all_gather", inp.dtype, count * word, "", "'push' or 'pull'",
                what="a block of ", floats=False)
    lanes = -(-count * word // 4)
    proto.launch(ctx, plan, _lamport_kernel, (out, inp, count), torch.int64, lanes,
                 (count, word), block, programs, warps, WORD=word)
