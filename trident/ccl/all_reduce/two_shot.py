"""Two-shot all-reduce: reduce-scatter by pulling, then all-gather by pushing.

Rank r owns segment r (about n/world elements): it reads that segment from every
rank's tensor over NVLink, reduces it in fp32 (integers: in their own type) and stores the
result into every rank's tensor, in place. Each rank moves 2*(world-1)/world*n, the bandwidth optimum, so this
wins from a few hundred KiB up (crossover in selector.py); one-shot wins below.
The tensor must be on the heap (a plain tensor is staged through a heap buffer).
Handshakes per program: ARRIVE (peers' inputs are in place) before reading, DONE
(peers finished with my tensor) before returning.

Bandwidth (the figures before this rework: docs/history.md, "Notes moved out of the source"):
- 16-byte remote loads and stores again. They went through a run-time shift (peers'
  copies may lie at other heap offsets) and were all scalar. Every program now checks
  after the ARRIVE wait whether all shifts are whole 16-byte vectors (device.py: "Vector
  accesses") and runs `_blocks` with VEC=True (ld/st.global.v4) if so, VEC=False
  (scalar, any shift) if not.
- One round trip per block, not WORLD of them. The old per-block loop over ranks was a
  runtime loop: it loaded from rank 0, waited, loaded from rank 1, ... (every program of
  every rank starting at rank 0, so one rank's link served all the others at a time), and
  before each load read the rank's shift (a volatile load) and its heap base. Now WORLD
  is a constexpr, the loops over ranks unroll, pointers are translated once per program
  (`peer_ptrs`), and `reduce_peers` issues all WORLD loads of a block before combining:
  every link carries reads at once, and a program keeps WORLD x 16 KiB in flight.
- The write-back is WORLD stores issued back to back (nothing waits on them), so they
  drain while the next block's loads are issued and in flight: the two halves overlap
  across blocks without a wait in between. (Which rank each program stores to first does
  not matter: the WORLD stores leave within a few dozen cycles of each other, so every
  link has a store of every program in flight; a per-program rotation was tried and
  only cost registers.)
- Above 4 ranks the block shrinks as in pull reduce-scatter (`reduce_block`: 8 KiB at 8
  ranks, the same 64 KiB of loads per program as 4 x 16 KiB; 8 x 16 KiB spilled).
To measure: busbw at 8-512 MiB (4 and 8 GPUs) against the figures above, NCCL and torch
symmetric memory; at 8 ranks also block=8192 bf16 elements against the default 4096.
"""
import triton
import triton.language as tl

from trident.trace import tags

from .. import common
from ..device import (DONE, OP_ALL_REDUCE, arrive, depart, peer_ptrs, peer_shifts, poison_out,
                      reduce_peers, store_peers)
from ..reduce_scatter.pull import reduce_block


@triton.jit
def _blocks(t, shifts, heap_bases, rank, n, seg, WORLD: tl.constexpr, OP: tl.constexpr,
            WORD: tl.constexpr, BLOCK: tl.constexpr, VEC: tl.constexpr):
    """This program's blocks of segment `rank`: reduce over every rank, store to every rank."""
    ptrs, oks = peer_ptrs(t, shifts, rank, heap_bases, WORLD, WORD, VEC)
    start = rank * seg
    for blk in range(tl.program_id(0), tl.cdiv(seg, BLOCK), tl.num_programs(0)):
        local = blk * BLOCK + tl.arange(0, BLOCK)
        offs = start + local
        mask = (local < seg) & (offs < n)
        y = reduce_peers(ptrs, oks, offs, mask, WORLD, OP, VEC).to(t.dtype.element_ty)
        store_peers(ptrs, oks, offs, y, mask, WORLD, VEC)


@triton.jit
def _two_shot_kernel(t, offsets, my_offset, flags, sync, ctrl, heap_bases, trace_buf, rank,
                     n, seg, fp, WORLD: tl.constexpr, OP: tl.constexpr, WORD: tl.constexpr,
                     BLOCK: tl.constexpr, TRACE: tl.constexpr):
    epoch, ok, t0 = arrive(offsets, my_offset, flags, sync, ctrl, heap_bases, trace_buf, rank,
                           WORLD, OP_ALL_REDUCE, fp, TRACE)
    shifts, aligned = peer_shifts(offsets, rank, my_offset, WORLD, WORD)
    if ok:                # else a peer is missing or made another call: touch no peer memory
        if aligned:
            _blocks(t, shifts, heap_bases, rank, n, seg, WORLD, OP, WORD, BLOCK, True)
        else:
            _blocks(t, shifts, heap_bases, rank, n, seg, WORLD, OP, WORD, BLOCK, False)
    ok = ok & depart(flags, DONE, epoch, ctrl, rank, WORLD, heap_bases, OP_ALL_REDUCE,
                     trace_buf, t0, tags.REDUCE, TRACE)
    if not ok:            # the peers' reduced segments in `t` may be missing
        poison_out(t, n, BLOCK)


def two_shot(ctx, plan, t, op_code: int, block=None, programs=None, warps=None):
    """In place on `t` (contiguous, checked by the caller). warps: a knob (common.py)."""
    n = t.numel()
    seg = common.round_up(triton.cdiv(n, ctx.world_size))
    buf = common.stage(ctx, plan, t, 0, "stage.inout")
    block = reduce_block(ctx, t.element_size(), block)
    block, grid = common.launch_size(ctx, seg, t.element_size(), block, programs)
    common.launch_on_heap(ctx, plan, _two_shot_kernel, (), buf, (n, seg),
                          (n, str(t.dtype), op_code), block, grid, warps, OP=op_code)
    common.unstage(plan, 0, t, buf)
