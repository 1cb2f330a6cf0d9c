"""One-shot all-reduce: every rank pushes its whole tensor into a scratch slot on every
peer, then reduces all slots locally.

One NVLink hop and one kernel, so it wins on latency for small tensors; it moves
(world-1)*n per rank instead of two-shot's 2*(world-1)/world*n, so two-shot wins
once bandwidth matters (crossover in selector.py). Works on any tensor: only the
scratch buffer has to be on the heap. Every rank reduces in rank order, so all ranks
get bit-identical results.
"""
import triton
import triton.language as tl

from trident.trace import device as trd, tags

from .. import common
from ..device import OP_ALL_REDUCE, push_begin, push_exchange, reduce_slots_into, send_blocks


@triton.jit
def _one_shot_kernel(t, scratch, flags, sync, ctrl, heap_bases, trace_buf, rank, world_size,
                     n, stride, half, fp, OP: tl.constexpr, BLOCK: tl.constexpr, TRACE: tl.constexpr):
    epoch, slots, t0 = push_begin(sync, scratch, half, TRACE)
    # my whole tensor into slot `rank` of every peer's scratch
    send_blocks(slots + rank * stride, t, t, n, rank, world_size, heap_bases, False, BLOCK)
    ok, t0 = push_exchange(flags, epoch, ctrl, rank, world_size, heap_bases, OP_ALL_REDUCE,
                           fp, trace_buf, t0, TRACE)
    reduce_slots_into(t, t, slots, stride, n, ok, rank, world_size, OP, BLOCK)
    trd.end(trace_buf, t0, tags.REDUCE, rank, TRACE)


def one_shot(ctx, plan, t, op_code: int, block=None, programs=None):
    """In place on `t` (contiguous, checked by the caller)."""
    n = t.numel()
    common.launch_push(ctx, plan, _one_shot_kernel, (t,), (), n, t.dtype,
                       (n, str(t.dtype), op_code), block, programs, OP=op_code)
