"""Pull all-gather: every rank reads every peer's block straight from the peer's input.

No scratch and no local copy: each byte crosses NVLink once and lands in the output,
so this wins for large blocks; the ARRIVE handshake before reading and the DONE one
before returning cost a round trip, so push wins for small blocks (see selector.py).
The input must be on the heap (a plain tensor is staged); the output can be any tensor.
"""
import triton
import triton.language as tl

import trident.language as tdl
from trident.trace import device as trd, kernel_args, tags

from .. import common
from ..device import (ARRIVE, DONE, OP_ALL_GATHER, begin_epoch, exchange, peer_shift,
                      publish_offset, shift_ok)


@triton.jit
def _pull_kernel(out, inp, offsets, my_offset, flags, sync, ctrl, heap_bases, trace_buf, rank,
                 world_size, n, WORD: tl.constexpr, BLOCK: tl.constexpr, TRACE: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = begin_epoch(sync)
    publish_offset(offsets, my_offset, rank, world_size, heap_bases)
    exchange(flags, ARRIVE, epoch, ctrl, rank, world_size, heap_bases,
             OP_ALL_GATHER, trace_buf, TRACE)
    t0 = trd.begin(TRACE)
    for i in range(world_size):
        src = (rank + i) % world_size
        shift = peer_shift(offsets, src, rank, my_offset, WORD)
        for blk in range(pid, tl.cdiv(n, BLOCK), nprog):
            offs = blk * BLOCK + tl.arange(0, BLOCK)
            mask = (offs < n) & shift_ok(shift)
            tdl.get(out + src * n + offs, inp + shift + offs, rank, src, heap_bases, mask=mask)
    trd.end(trace_buf, t0, tags.FETCH, rank, TRACE)
    exchange(flags, DONE, epoch, ctrl, rank, world_size, heap_bases,
             OP_ALL_GATHER, trace_buf, TRACE)


def pull(ctx, plan, out, inp, block=None, programs=None):
    """out, inp: flat word views (checked by the caller); out has world * inp.numel()."""
    n = inp.numel()
    src = common.stage(ctx, plan, inp, 1, "stage.in")
    st = common.state(ctx)
    block, grid = common.launch_size(ctx, n, inp.element_size(), block, programs)
    trace_buf, trace = kernel_args(ctx)
    plan.launch(
        _pull_kernel, (grid,), out, src, st.offsets, common.heap_offset(ctx, src), st.flags,
        st.sync, ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank, ctx.world_size, n,
        WORD=src.element_size(), BLOCK=block, TRACE=trace, **common.kernel_options(ctx))
