"""Push reduce-scatter: every rank stores block p of its input into a scratch slot on
rank p, then each rank reduces its slots (and its own block, read in place).

One NVLink hop and no handshake before sending, so it wins for small blocks; pull
(no scratch, reads in place) wins for large ones (crossover in selector.py). Works on
any tensors: only the scratch is on the heap. Accumulates in fp32 (integers: in their
own type, device.to_acc), in rank order.
"""
import triton
import triton.language as tl

from trident.trace import device as trd, tags

from .. import common
from ..device import (OP_REDUCE_SCATTER, push_begin, push_exchange, reduce_slots_into,
                      scatter_blocks)


@triton.jit
def _push_kernel(out, inp, scratch, flags, sync, ctrl, heap_bases, trace_buf, rank, world_size,
                 n, stride, half, fp, OP: tl.constexpr, BLOCK: tl.constexpr,
                 TRACE: tl.constexpr):
    epoch, slots, t0 = push_begin(sync, scratch, half, TRACE)
    # block p of my input into slot `rank` of peer p's scratch
    scatter_blocks(slots + rank * stride, inp, n, rank, world_size, heap_bases, BLOCK)
    ok, t0 = push_exchange(flags, epoch, ctrl, rank, world_size, heap_bases,
                           OP_REDUCE_SCATTER, fp, trace_buf, t0, TRACE)
    reduce_slots_into(out, inp + rank * n, slots, stride, n, ok, rank, world_size, OP, BLOCK)
    trd.end(trace_buf, t0, tags.REDUCE, rank, TRACE)


def push(ctx, plan, out, inp, op_code: int, block=None, programs=None):
    """out [n], inp [world * n] (checked by the caller)."""
    n = out.numel()
    common.launch_push(ctx, plan, _push_kernel, (out, inp), (), n, inp.dtype,
                       (n, str(inp.dtype), op_code), block, programs, OP=op_code)
