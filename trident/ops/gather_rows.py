"""What both all_gather_matmul kernels run alike (the Triton one of all_gather_matmul.py and
the warp-specialised Gluon one of fused_gluon.py): the pushers, the tiles' arrival order
and the wait for a tile's rows -- one protocol, so that ranks on either kernel exchange
the same blocks, flags and fingerprints.

The helpers are @triton.jit functions, which a Gluon kernel calls as they are
(trident/language/gluon.py); they make no tensor from nothing: the pushers take their row
and column offsets (`offs_m`, `offs_k`: tl.arange in a Triton kernel, gl.arange with a
layout in a Gluon one). THREADS: the threads that vote in each wait (tdl.wait): 0 in a
Triton kernel, the default warps' threads (or 32 in a one-warp partition) in a
warp-specialised Gluon kernel.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .. import language as tdl
from ..runtime.errors import OP_CODES
from ..trace import device as trd
from ..trace import tags
from ._common import signal_call, tile_position, wait_call, wait_peers_done

OP = tl.constexpr(OP_CODES["all_gather_matmul"])


@triton.jit
def push_rows(a, stride_am, gathered, flags, sync, epoch, ctrl, heap_bases, trace_buf,
              rank, world_size, m_local, K, num_mb, pid, fp, offs_m, offs_k,
              NUM_PUSHERS: tl.constexpr, BM: tl.constexpr, COPY_M: tl.constexpr,
              COPY_K: tl.constexpr, TRACE: tl.constexpr, THREADS: tl.constexpr = 0):
    """Copy this rank's rows, block by block, into every rank's gathered buffer (itself
    first, 16-byte vector stores over NVLink) and flag each block there once it is
    complete (with the call's fingerprint). offs_m, offs_k: 0..COPY_M-1 and 0..COPY_K-1.
    If a peer never acked the previous call, nothing is pushed: no peer memory is
    touched."""
    g0 = rank * m_local                       # first global row of this rank
    first_mb = g0 // BM
    num_items = (g0 + m_local - 1) // BM - first_mb + 1
    ok = wait_peers_done(sync, epoch, ctrl, rank, world_size, OP, THREADS)  # buffers free
    num_items = tl.where(ok, num_items, 0)
    for item in range(pid, num_items, NUM_PUSHERS):
        t0 = trd.begin(TRACE)
        mb = first_mb + item
        r_lo = tl.maximum(mb * BM, g0)
        r_hi = tl.minimum(mb * BM + BM, g0 + m_local)
        for r0 in range(r_lo, r_hi, COPY_M):
            rows = r0 + offs_m
            row_ok = rows < r_hi
            for k0 in range(0, K, COPY_K):
                cols = k0 + offs_k
                mask = row_ok[:, None] & (cols < K)[None, :]
                x = tl.load(a + (rows - g0)[:, None].to(tl.int64) * stride_am + cols[None, :],
                            mask=mask)
                dst = gathered + rows[:, None].to(tl.int64) * K + cols[None, :]
                for d in range(world_size):
                    tdl.store(dst, x, rank, (rank + d) % world_size, heap_bases, mask=mask)
        for d in range(world_size):
            signal_call(flags + 2 * (rank * num_mb + mb), epoch, fp, rank,
                        (rank + d) % world_size, heap_bases)
        trd.end(trace_buf, t0, tags.SEND, rank, TRACE)


@triton.jit
def arrival_tile(t, rank, world_size, m_local, num_mb, num_nb, BM: tl.constexpr,
                 GROUP_M: tl.constexpr, ALIGNED: tl.constexpr):
    """Tile t of the GEMM -> (row block, column block), in the order the rows arrive: the
    i-th row block in arrival order (this rank's first block, then the first block of
    rank+1, rank+2, ..., then every rank's second block, ...), GROUP_M row blocks at a
    time so that a group's tiles share W in L2. ALIGNED: m_local % BM == 0 (blocks never
    straddle ranks)."""
    i, nb = tile_position(t, num_mb, num_nb, GROUP_M)
    if ALIGNED:
        per_rank = m_local // BM
        mb = ((rank + i % world_size) % world_size) * per_rank + i // world_size
    else:
        mb = (i + (rank * m_local) // BM) % num_mb
    return mb, nb


@triton.jit
def wait_rows(flags, mb, m0, m_end, m_local, num_mb, epoch, fp, ctrl, rank,
              THREADS: tl.constexpr = 0):
    """Wait (bounded, acquire, system scope: _common.wait_call) for row block mb's flag of
    every source rank whose rows [m0, m_end) cover; True if every one came in this call."""
    ok = tl.cast(1, tl.int1)
    for s in range(m0 // m_local, (m_end - 1) // m_local + 1):
        ok = ok & wait_call(flags + 2 * (s * num_mb + mb), epoch, fp, ctrl, rank, s, OP,
                            THREADS)
    return ok
