"""Lamport all-to-all in LL units (even or uneven splits): rank r stores the rows it has for
rank p into its slot of p's receive buffer as 8-byte units, 4 bytes of payload beside a
4-byte flag (the round), and p copies each peer's units into its output, at the place
out_splits gives them, as soon as their flags say this round (ccl/lamport.py, "LL
units"); a rank's rows to itself are a local copy.

It moves what one_shot moves, twice that on the wire (half of each unit is flag), in one
kernel and one NVLink trip, without one_shot's release fence and flag, so it is the
latency path for small messages: a block to or from a peer of at most half of
`ccl.lamport.capacity` bytes (512 KiB with the default heap; ValueError above, on the
ranks that send or expect it: where the splits are uneven the others stop on that rank's
error, PeerFailed). push and one_shot win once bandwidth matters. Any dtype and row
shape, bit for bit.

Programs (rows.py, "Pairs and programs"): program q serves distance k = q % (w-1) + 1 as
the pair's program v = q // (w-1): it sends units v, v + U, ... (blocks of BLOCK) of its
rows to rank + k and receives those of rank - k, U = pair_programs(the pair's units),
which both ends know (sender from in_splits, receiver from out_splits). Each rank sizes
its own grid (rows.grid_size); the ranks need not agree on it. Each pair's program sends
one head (the round and the call's fingerprint: dtype, row shape, launch size) to its
peer, with the count of words it sends folded in (`_head`), and the peer's program of the
same id waits for it, with the units: a count other than the one out_splits expects, or
another call, is CallMismatch on the receiving rank (and, through its error word, at the
others' next host call), and the rows it expected from that peer are poisoned (all bits
set: NaN). A pair's program 0 always takes part, so every rank waits for a head of every
peer each round (the rounds' rule: ccl/lamport.py).
"""
import torch
import triton
import triton.language as tl

import trident.language as tdl
from trident.trace import device as trd, tags

from .. import lamport as proto, lamport_ll as ll
from ..device import MAX_PROGRAMS, OP_ALL_TO_ALL, poison
from .rows import (alignment, check_no_overlap, copy_own_rows, even_count, grid_size,
                   pair_programs, rows_from, rows_to, splits_tensor)


@triton.jit
def _head(epoch, fp, count):
    """The head of a pair: the round and the call's fingerprint with the pair's word count
    folded in (exact: counts are below 2**29, and the fingerprint's bit 0, always set, is
    left as it is, so the head is never 0)."""
    return proto.head(epoch, fp ^ ((tl.cast(count, tl.int64) & 0x1FFFFFFF) << 1))


@triton.jit
def _units(count, WORD: tl.constexpr):
    """The LL units a pair of `count` words of WORD bytes moves: 4 bytes of payload each,
    an even number (the pair's last one may carry nothing), so that the compiler knows a
    thread's two units share their mask: one 16-byte store and poll (tests/compile/sm90.py).
    Sender and receiver count alike, and the receiver clears every one."""
    return tl.cdiv(count * WORD, 8) * 2


@triton.jit
def _lamport_kernel(out, inp, splits, cap, data, heads, lsync, fsync, ctrl, heap_bases,
                    trace_buf, rank, n, slot, fp, WORLD: tl.constexpr, WORD: tl.constexpr,
                    ALIGN: tl.constexpr, EVEN: tl.constexpr, BLOCK: tl.constexpr,
                    TRACE: tl.constexpr, PDL: tl.constexpr):
    """splits (int64, in words of WORD bytes): [in_offsets | in_counts | out_offsets |
    out_counts], unused when EVEN (then every pair moves `n` words). `cap`: most programs
    per pair. BLOCK: units (4 bytes of payload each) a program moves per step."""
    t0 = trd.begin(TRACE)
    epoch, buf, base, _ = proto.open_round(data, lsync, slot, fp, WORLD, PDL)
    flag = ll.ll_flag(epoch)
    pid = tl.program_id(0)
    k = pid % (WORLD - 1) + 1            # this program's distance: to rank+k, from rank-k
    v = pid // (WORLD - 1)               # its index among the pair's programs
    # send: my rows for rank+k into my slot of its buffer, then the pair's head
    peer = (rank + k) % WORLD
    count, src = rows_to(inp, splits, n, peer, WORLD, ALIGN, EVEN)
    units = _units(count, WORD)
    senders = pair_programs(units, BLOCK, cap)
    if v < senders:
        for blk in range(v, tl.cdiv(units, BLOCK), senders):
            offs = blk * BLOCK + tl.arange(0, BLOCK)
            words = ll.ll_units(ll.pack(src, offs, count, WORD), flag)
            tdl.store(base + rank * slot + offs, words, rank, peer, heap_bases,
                      mask=offs < units)
        tdl.store(heads + (buf * WORLD + rank) * MAX_PROGRAMS + pid, _head(epoch, fp, count),
                  rank, peer, heap_bases)
    # own rows, every program, while the peers' are in flight (the host checked that
    # in_splits and out_splits agree on them)
    copy_own_rows(out, inp, splits, n, rank, WORLD, heap_bases, BLOCK, ALIGN, EVEN)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    # receive from rank-k: this program's units of its slot, once they and the head came
    src_rank = (rank + WORLD - k) % WORLD
    expect, dst = rows_from(out, splits, n, src_rank, WORLD, ALIGN, EVEN)
    units = _units(expect, WORD)
    used = pair_programs(units, BLOCK, cap)    # the pair's programs, if the counts agree
    if v < used:
        t0 = trd.begin(TRACE)
        heads_row = heads + buf * WORLD * MAX_PROGRAMS + pid
        head = _head(epoch, fp, expect)
        ok = tl.cast(1, tl.int1)
        # at least one look (no rows: the head alone)
        for blk in range(v, tl.maximum(tl.cdiv(units, BLOCK), 1), used):
            offs = blk * BLOCK + tl.arange(0, BLOCK)
            lanes, ok = proto.receive_ll(base, slot, heads_row, src_rank, offs, offs < units,
                                         flag, head, ok, ctrl, fsync, rank, heap_bases, WORLD,
                                         OP_ALL_TO_ALL)
            ll.unpack(dst, poison(lanes, ok), offs, expect, WORD)
        tl.store(heads_row + src_rank * MAX_PROGRAMS, tl.cast(0, tl.int64))
        trd.end(trace_buf, t0, tags.COPY, rank, TRACE)
    proto.end(lsync, epoch)


def fits(ctx, nbytes: int) -> bool:
    """Whether an input of `nbytes` with even splits (the selector's measure; splits given:
    1 << 62) is within what this context's Lamport buffers take: its block per peer
    (registry.py: "auto" passes over it otherwise)."""
    return nbytes <= proto.limit(ctx, "all_to_all") * ctx.world_size


def lamport(ctx, plan, out, inp, out_splits, in_splits, row, call, block=None,
            programs=None, warps=None):
    """out, inp: flat word views; splits in rows of `row` words (checked by the caller);
    `call`: what every rank's call must share (dtype, row shape) for the fingerprint.
    warps: a knob (common.py)."""
    check_no_overlap(out, inp)
    w, word = ctx.world_size, out.element_size()
    largest = max((c * row * word for p, c in enumerate(in_splits + out_splits)
                   if p % w != ctx.rank), default=0)
    proto.check(ctx, "all_to_all", out.dtype, largest, "", "'one_shot' or 'push'",
                what="a block to or from a peer of ", floats=False)
    block, limit = proto.launch_size(ctx, torch.int64, 1 << 62, block, programs, warps)
    cap = max(1, limit // (w - 1))

    def units(splits):                 # _units
        return [triton.cdiv(c * row * word, 8) * 2 for c in splits]
    grid = grid_size(ctx.rank, w, units(in_splits), units(out_splits), 1 << 62, block, cap)
    n = even_count(in_splits, out_splits, row)
    proto.launch(ctx, plan, _lamport_kernel,
                 (out, inp, splits_tensor(ctx, in_splits, out_splits, row), cap), torch.int64,
                 n or 0, (word, block, cap, *call), block, programs, warps, grid=grid,
                 WORD=word, ALIGN=alignment(row), EVEN=n is not None)

