"""Pull reduce-scatter: every rank reads its block from every rank's input over NVLink
and reduces it in fp32, in rank order.

No scratch and no extra copy, so it wins for large blocks; the ARRIVE and DONE
handshakes cost a round trip, so push wins for small blocks (see selector.py). The
input must be on the heap (a plain tensor is staged); the output can be any tensor.
"""
import triton
import triton.language as tl

from trident.trace import device as trd, kernel_args, tags

from .. import common
from ..device import (ARRIVE, DONE, OP_REDUCE_SCATTER, begin_epoch, exchange, publish_offset,
                      reduce_peers)


@triton.jit
def _pull_kernel(out, inp, offsets, my_offset, flags, sync, ctrl, heap_bases, trace_buf, rank,
                 world_size, n, OP: tl.constexpr, WORD: tl.constexpr, BLOCK: tl.constexpr,
                 TRACE: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = begin_epoch(sync)
    publish_offset(offsets, my_offset, rank, world_size, heap_bases)
    exchange(flags, ARRIVE, epoch, ctrl, rank, world_size, heap_bases,
             OP_REDUCE_SCATTER, trace_buf, TRACE)
    t0 = trd.begin(TRACE)
    for blk in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        acc = reduce_peers(inp + rank * n, offs, mask, offsets, my_offset, rank, world_size,
                           heap_bases, OP, WORD)
        tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)
    trd.end(trace_buf, t0, tags.REDUCE, rank, TRACE)
    exchange(flags, DONE, epoch, ctrl, rank, world_size, heap_bases,
             OP_REDUCE_SCATTER, trace_buf, TRACE)


def pull(ctx, plan, out, inp, op_code: int, block=None, programs=None):
    """out [n], inp [world * n] (checked by the caller)."""
    n = out.numel()
    src = common.stage(ctx, plan, inp, 1, "stage.in")
    st = common.state(ctx)
    block, grid = common.launch_size(ctx, n, inp.element_size(), block, programs)
    trace_buf, trace = kernel_args(ctx)
    plan.launch(
        _pull_kernel, (grid,), out, src, st.offsets, common.heap_offset(ctx, src), st.flags,
        st.sync, ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank, ctx.world_size, n, OP=op_code,
        WORD=src.element_size(), BLOCK=block, TRACE=trace, **common.kernel_options(ctx))
