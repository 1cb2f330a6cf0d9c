"""What both row-parallel fused kernels run alike (the Triton one of matmul_reduce_scatter.py,
for matmul_reduce_scatter and matmul_all_reduce, and the warp-specialised Gluon one of
matmul_reduce_gluon.py): the tiles' order and owners, the push of a finished partial tile
into its owner's slot, the reducers and the all-reduce's gather programs -- one protocol,
so that ranks on either kernel exchange the same slots, flags and fingerprints.

The helpers are @triton.jit functions, which a Gluon kernel calls as they are
(trident/language/gluon.py); they make no tensor from nothing: the callers pass a tile's
row and column offsets (`rows` 0..BM-1, `cols` 0..BN-1: tl.arange in a Triton kernel,
gl.arange with a layout in a Gluon one) and, to the reducers, the fp32 zero tile they
sum into; `offs` is rows[:, None] * BN + cols[None, :]. THREADS: the threads that vote in
each wait (tdl.wait): 0 in a Triton kernel, the default warps' threads in a
warp-specialised Gluon kernel (inside its default partition or outside the partitions:
Triton's own barrier 0 counts them alike there).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .. import language as tdl
from ..ccl.device import poison
from ..trace import device as trd
from ..trace import tags
from ._common import (SYNC_ACK, add_bias_at, signal_call, store_at, tile_position, wait_call,
                      wait_peers_done)


@triton.jit
def tile_of(t, rank, world_size, M, N, m_local, BM: tl.constexpr, BN: tl.constexpr,
            GROUP_M: tl.constexpr, ALL_REDUCE: tl.constexpr):
    """Tile t -> (first row, end row, first column, owner rank, slot on the owner). Row and
    column blocks in grouped order (gemm.tile_position; GROUP_M 1: row by row)."""
    num_nb = tl.cdiv(N, BN)
    if ALL_REDUCE:                            # round-robin owners over all tiles
        owner = t % world_size
        slot = t // world_size
        mb, nb = tile_position(t, tl.cdiv(M, BM), num_nb, GROUP_M)
        m0 = mb * BM
        m_end = tl.minimum(m0 + BM, M)
    else:                                     # owner's rows, tiled from its first row
        per_owner = tl.cdiv(m_local, BM) * num_nb
        owner = t // per_owner
        slot = t % per_owner
        mb, nb = tile_position(slot, tl.cdiv(m_local, BM), num_nb, GROUP_M)
        m0 = owner * m_local + mb * BM
        m_end = tl.minimum(m0 + BM, owner * m_local + m_local)
    n0 = nb * BN
    return m0, m_end, n0, owner, slot


@triton.jit
def unit_tile(u, split_k, rank, world_size, num_tiles, SPLIT: tl.constexpr,
              ALL_REDUCE: tl.constexpr):
    """Work unit u of the GEMM programs' queue -> (tile t, q): SPLIT: unit u = (the tile q
    = u // split_k in this rank's order, K slice u - q * split_k), else u is q. This
    rank's order: all-reduce, from tile `rank` on (round-robin owners: each rank starts
    on its own); reduce-scatter, owner by owner from rank + 1, so that this rank's own
    tiles -- which need no transfer -- come last and cover the tail of the transfers."""
    if SPLIT:
        q = u // split_k
    else:
        q = u
    if ALL_REDUCE:
        t = (q + rank) % num_tiles
    else:
        t = (q + (rank + 1) * (num_tiles // world_size)) % num_tiles
    return t, q


@triton.jit
def push_partial(acc, partials, flags, sync, ctrl, heap_bases, trace_buf, epoch, fp, rank,
                 owner, slot, slots, offs, BM: tl.constexpr, BN: tl.constexpr,
                 OP: tl.constexpr, TRACE: tl.constexpr, THREADS: tl.constexpr = 0):
    """This rank's finished fp32 partial `acc` of a tile -> its slot for this rank on the
    tile's owner, in the input dtype (offs: rows * BN + cols, 16-byte stores where the
    layout has 8 columns a thread), then the slot's flag there with the call's
    fingerprint (release). Only once the owner acked the previous call (it is done with
    the slot): else nothing is written on it (the wait recorded the error)."""
    t0 = trd.begin(TRACE)
    if tdl.wait(sync + SYNC_ACK + owner, epoch - 1, ctrl, rank, owner, OP, THREADS):
        dst = partials + (rank * slots + slot).to(tl.int64) * (BM * BN) + offs
        tdl.store(dst, acc.to(partials.dtype.element_ty), rank, owner, heap_bases)
        signal_call(flags + 2 * (rank * slots + slot), epoch, fp, rank, owner, heap_bases)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)


@triton.jit
def reduce_slot(slot, acc, offs, rows, cols, out, bias, partials, result, flags, ready, sync,
                ctrl, heap_bases, trace_buf, epoch, fp, rank, world_size, M, N, m_local,
                stride_om, num_tiles, slots, BM: tl.constexpr, BN: tl.constexpr,
                GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr, ALL_REDUCE: tl.constexpr,
                OP: tl.constexpr, TRACE: tl.constexpr, THREADS: tl.constexpr = 0):
    """A reducer program: slot `slot` of this rank's tiles, summed over the ranks' partials
    in rank order in fp32 (acc: a zero [BM, BN] tile), plus the bias, into `out`;
    all-reduce: also into this rank's heap tile `result`, flagged on every peer for the
    gather programs. A failed wait poisons the tile (NaN) and flags nothing. offs: rows *
    BN + cols, the offsets of a slot's tile."""
    ok = tl.cast(1, tl.int1)
    if ALL_REDUCE:
        t = slot * world_size + rank
        ok = wait_peers_done(sync, epoch, ctrl, rank, world_size, OP, THREADS)  # result free
    else:
        t = rank * slots + slot
    if t < num_tiles:
        m0, m_end, n0, owner, slot = tile_of(t, rank, world_size, M, N, m_local, BM, BN,
                                             GROUP_M, ALL_REDUCE)
        t0 = trd.begin(TRACE)
        for s in range(world_size):
            ok = ok & wait_call(flags + 2 * (s * slots + slot), epoch, fp, ctrl, rank, s, OP,
                                THREADS)
            src = partials + (s * slots + slot).to(tl.int64) * (BM * BN) + offs
            acc += tl.load(src).to(tl.float32)
        acc = poison(add_bias_at(acc, bias, n0 + cols, N, HAS_BIAS), ok)
        if ALL_REDUCE:
            store_at(out, stride_om, acc, m0 + rows, n0 + cols, m_end, N)
            tl.store(result + slot.to(tl.int64) * (BM * BN) + offs,
                     acc.to(result.dtype.element_ty))
            if ok:
                for d in range(1, world_size):
                    signal_call(ready + 2 * t, epoch, fp, rank, (rank + d) % world_size,
                                heap_bases)
        else:
            first = m0 - rank * m_local          # the tile's rows among this rank's
            end = m_end - rank * m_local
            store_at(out, stride_om, acc, first + rows, n0 + cols, end, N)
        trd.end(trace_buf, t0, tags.REDUCE, rank, TRACE)


@triton.jit
def gather_tile(t, offs, rows, cols, out, result, ready, ctrl, heap_bases, trace_buf, epoch, fp,
                rank, world_size, M, N, m_local, stride_om, BM: tl.constexpr,
                BN: tl.constexpr, GROUP_M: tl.constexpr, ALL_REDUCE: tl.constexpr,
                OP: tl.constexpr, TRACE: tl.constexpr, THREADS: tl.constexpr = 0):
    """An all-reduce gather program: tile t, if another rank owns it, copied from that
    rank's `result` once flagged (poisoned if the wait failed) into `out` (offs: as
    reduce_slot's). Launched for ALL_REDUCE only (the kernel's constexpr, passed on so
    that a reduce-scatter kernel compiles as it did)."""
    m0, m_end, n0, owner, slot = tile_of(t, rank, world_size, M, N, m_local, BM, BN, GROUP_M,
                                         ALL_REDUCE)
    if owner != rank:
        t0 = trd.begin(TRACE)
        ok = wait_call(ready + 2 * t, epoch, fp, ctrl, rank, owner, OP, THREADS)
        tile = tdl.load(result + slot.to(tl.int64) * (BM * BN) + offs, rank, owner,
                        heap_bases, mask=(offs >= 0) & ok, other=0.0)
        store_at(out, stride_om, poison(tile, ok), m0 + rows, n0 + cols, m_end, N)
        trd.end(trace_buf, t0, tags.FETCH, rank, TRACE)
