"""Push reduce-scatter: every rank stores block p of its input into a scratch slot on
rank p, then each rank reduces its slots (and its own block, read in place).

One NVLink hop and no handshake before sending, so it wins for small blocks; pull
(no scratch, reads in place) wins for large ones (crossover in selector.py). Works on
any tensors: only the scratch is on the heap. Accumulates in fp32, in rank order.
"""
import triton
import triton.language as tl

import trident.language as tdl
from trident.trace import device as trd, tags

from .. import common
from ..device import (DATA, OP_REDUCE_SCATTER, begin_epoch, exchange, poison, reduce_slots,
                      scratch_half)


@triton.jit
def _push_kernel(out, inp, scratch, flags, sync, ctrl, heap_bases, trace_buf, rank, world_size,
                 n, stride, half, fp, OP: tl.constexpr, BLOCK: tl.constexpr,
                 TRACE: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = begin_epoch(sync)
    slots = scratch_half(scratch, epoch, half)
    t0 = trd.begin(TRACE)
    for blk in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        for i in range(1, world_size):
            peer = (rank + i) % world_size
            x = tl.load(inp + peer * n + offs, mask=mask)
            tdl.store(slots + rank * stride + offs, x, rank, peer, heap_bases, mask=mask)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    ok = exchange(flags, DATA, epoch, ctrl, rank, world_size, heap_bases,
                  OP_REDUCE_SCATTER, fp, trace_buf, TRACE)
    t0 = trd.begin(TRACE)
    for blk in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        acc = reduce_slots(inp + rank * n, slots, stride, offs, mask, rank, world_size, OP)
        tl.store(out + offs, poison(acc.to(out.dtype.element_ty), ok), mask=mask)
    trd.end(trace_buf, t0, tags.REDUCE, rank, TRACE)


def push(ctx, plan, out, inp, op_code: int, block=None, programs=None):
    """out [n], inp [world * n] (checked by the caller)."""
    n = out.numel()
    common.launch_push(ctx, plan, _push_kernel, (out, inp), (), n, inp.dtype,
                       (n, str(inp.dtype), op_code), block, programs, OP=op_code)
