"""Two-shot all-reduce: reduce-scatter by pulling, then all-gather by pushing.

Rank r owns segment r (about n/world elements): it reads that segment from every
rank's tensor over NVLink, reduces it in fp32 and stores the result into every rank's
tensor, in place. Each rank moves 2*(world-1)/world*n, the bandwidth optimum, so this
wins from a few hundred KiB up (crossover in selector.py); one-shot wins below.
The tensor must be on the heap (a plain tensor is staged through a heap buffer).
Handshakes per program: ARRIVE (peers' inputs are in place) before reading, DONE
(peers finished with my tensor) before returning.
"""
import triton
import triton.language as tl

import trident.language as tdl
from trident.trace import device as trd, kernel_args, tags

from .. import common
from ..device import (ARRIVE, DONE, OP_ALL_REDUCE, begin_epoch, exchange, peer_shift,
                      publish_offset, reduce_peers, shift_ok)


@triton.jit
def _two_shot_kernel(t, offsets, my_offset, flags, sync, ctrl, heap_bases, trace_buf, rank,
                     world_size, n, seg, OP: tl.constexpr, WORD: tl.constexpr,
                     BLOCK: tl.constexpr, TRACE: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = begin_epoch(sync)
    publish_offset(offsets, my_offset, rank, world_size, heap_bases)
    exchange(flags, ARRIVE, epoch, ctrl, rank, world_size, heap_bases,
             OP_ALL_REDUCE, trace_buf, TRACE)
    t0 = trd.begin(TRACE)
    start = rank * seg
    for blk in range(pid, tl.cdiv(seg, BLOCK), nprog):
        local = blk * BLOCK + tl.arange(0, BLOCK)
        offs = start + local
        mask = (local < seg) & (offs < n)
        y = reduce_peers(t, offs, mask, offsets, my_offset, rank, world_size, heap_bases, OP,
                         WORD).to(t.dtype.element_ty)
        for i in range(world_size):
            dst = (rank + i) % world_size
            shift = peer_shift(offsets, dst, rank, my_offset, WORD)
            tdl.store(t + shift + offs, y, rank, dst, heap_bases, mask=mask & shift_ok(shift))
    trd.end(trace_buf, t0, tags.REDUCE, rank, TRACE)
    exchange(flags, DONE, epoch, ctrl, rank, world_size, heap_bases,
             OP_ALL_REDUCE, trace_buf, TRACE)


def two_shot(ctx, plan, t, op_code: int, block=None, programs=None):
    """In place on `t` (contiguous, checked by the caller)."""
    n = t.numel()
    seg = common.round_up(triton.cdiv(n, ctx.world_size))
    buf = common.stage(ctx, plan, t, 0, "stage.inout")
    st = common.state(ctx)
    block, grid = common.launch_size(ctx, seg, t.element_size(), block, programs)
    trace_buf, trace = kernel_args(ctx)
    plan.launch(
        _two_shot_kernel, (grid,), buf, st.offsets, common.heap_offset(ctx, buf), st.flags,
        st.sync, ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank, ctx.world_size, n, seg,
        OP=op_code, WORD=buf.element_size(), BLOCK=block, TRACE=trace,
        **common.kernel_options(ctx))
    common.unstage(plan, 0, t, buf)
