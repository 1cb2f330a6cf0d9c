"""Push all-gather: every rank stores its block into a scratch slot on every peer, then
each rank copies the slots into its output.

One NVLink hop, no handshake before sending (the scratch is ours, see device.py), so
it wins for small blocks; for large ones the local copy out of the scratch costs HBM
bandwidth and pull (no copy) wins (crossover in selector.py). Works on any tensors.
"""
import triton
import triton.language as tl

import trident.language as tdl
from trident.trace import device as trd, tags

from .. import common
from ..device import DATA, OP_ALL_GATHER, begin_epoch, exchange, poison, scratch_half


@triton.jit
def _push_kernel(out, inp, scratch, flags, sync, ctrl, heap_bases, trace_buf, rank, world_size,
                 n, stride, half, fp, BLOCK: tl.constexpr, TRACE: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = begin_epoch(sync)
    slots = scratch_half(scratch, epoch, half)
    t0 = trd.begin(TRACE)
    for blk in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(inp + offs, mask=mask)
        for i in range(1, world_size):
            tdl.store(slots + rank * stride + offs, x, rank, (rank + i) % world_size,
                      heap_bases, mask=mask)
        tl.store(out + rank * n + offs, x, mask=mask)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    ok = exchange(flags, DATA, epoch, ctrl, rank, world_size, heap_bases,
                  OP_ALL_GATHER, fp, trace_buf, TRACE)
    t0 = trd.begin(TRACE)
    for blk in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        for i in range(1, world_size):
            src = (rank + i) % world_size
            x = tl.load(slots + src * stride + offs, mask=mask)
            tl.store(out + src * n + offs, poison(x, ok), mask=mask)
    trd.end(trace_buf, t0, tags.COPY, rank, TRACE)


def push(ctx, plan, out, inp, block=None, programs=None):
    """out, inp: flat word views (checked by the caller); out has world * inp.numel()."""
    n = inp.numel()
    common.launch_push(ctx, plan, _push_kernel, (out, inp), (), n, inp.dtype,
                       (n, inp.element_size()), block, programs)
