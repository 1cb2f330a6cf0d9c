"""Push all-gather: every rank stores its block into a scratch slot on every peer, then
each rank copies the slots into its output.

One NVLink hop, no handshake before sending (the scratch is ours, see device.py), so
it wins for small blocks; for large ones the local copy out of the scratch costs HBM
bandwidth and pull (no copy) wins (crossover in selector.py). Works on any tensors.
"""
import triton
import triton.language as tl

from trident.trace import device as trd, tags

from .. import common
from ..device import OP_ALL_GATHER, gather_slots, push_begin, push_exchange, send_blocks


@triton.jit
def _push_kernel(out, inp, scratch, flags, sync, ctrl, heap_bases, trace_buf, rank, world_size,
                 n, stride, half, fp, BLOCK: tl.constexpr, TRACE: tl.constexpr):
    epoch, slots, t0 = push_begin(sync, scratch, half, TRACE)
    # my block into slot `rank` of every peer's scratch, and into my own output
    send_blocks(slots + rank * stride, inp, out + rank * n, n, rank, world_size, heap_bases,
                True, BLOCK)
    ok, t0 = push_exchange(flags, epoch, ctrl, rank, world_size, heap_bases, OP_ALL_GATHER,
                           fp, trace_buf, t0, TRACE)
    gather_slots(out, slots, stride, n, ok, rank, world_size, BLOCK)
    trd.end(trace_buf, t0, tags.COPY, rank, TRACE)


def push(ctx, plan, out, inp, block=None, programs=None):
    """out, inp: flat word views (checked by the caller); out has world * inp.numel()."""
    n = inp.numel()
    common.launch_push(ctx, plan, _push_kernel, (out, inp), (), n, inp.dtype,
                       (n, inp.element_size()), block, programs)
