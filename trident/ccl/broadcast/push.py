"""Push broadcast: the source stores its tensor into a scratch buffer on every peer; each
peer copies it out into its own tensor.

One NVLink hop, no handshake before sending, any tensors. The source sends (world-1)*n,
so for large tensors at many ranks a pipelined or pull scheme could beat it; at 2-8
NVLink peers the source's outgoing links are all used at once. Every rank also tells
every peer it arrived (and waits for that at the end), which keeps all ranks within one
launch of each other -- the rule that makes the scratch halves safe (device.py).
"""
import triton
import triton.language as tl

from trident.trace import device as trd, tags

from .. import common
from ..device import (ARRIVE, DATA, OP_BROADCAST, begin_epoch, notify_all, poison, scratch_half,
                      send_blocks, wait_all, wait_for)


@triton.jit
def _push_kernel(t, scratch, flags, sync, ctrl, heap_bases, trace_buf, rank, world_size, src,
                 n, stride, half, fp, BLOCK: tl.constexpr, TRACE: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = begin_epoch(sync)
    slot = scratch_half(scratch, epoch, half)
    notify_all(flags, ARRIVE, epoch, rank, world_size, heap_bases, fp)
    t0 = trd.begin(TRACE)
    if rank == src:
        send_blocks(slot, t, t, n, rank, world_size, heap_bases, False, BLOCK)
        notify_all(flags, DATA, epoch, rank, world_size, heap_bases, 0)   # fp: at ARRIVE
        trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    else:
        ok = wait_for(flags, DATA, epoch, src, ctrl, rank, OP_BROADCAST, fp)
        trd.end(trace_buf, t0, tags.WAIT, rank, TRACE)
        t0 = trd.begin(TRACE)
        for blk in range(pid, tl.cdiv(n, BLOCK), nprog):
            offs = blk * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(t + offs, poison(tl.load(slot + offs, mask=mask), ok), mask=mask)
        trd.end(trace_buf, t0, tags.COPY, rank, TRACE)
    wait_all(flags, ARRIVE, epoch, ctrl, rank, world_size, OP_BROADCAST, fp)


def push(ctx, plan, t, src: int, block=None, programs=None):
    """t: a flat word view (checked by the caller)."""
    n = t.numel()
    common.launch_push(ctx, plan, _push_kernel, (t,), (src,), n, t.dtype,
                       (n, t.element_size(), src), block, programs, slots=1)
