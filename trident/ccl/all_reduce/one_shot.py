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

import trident.language as tdl
from trident.trace import device as trd, tags

from .. import common
from ..device import DATA, OP_ALL_REDUCE, begin_epoch, exchange, poison, reduce_slots, scratch_half


@triton.jit
def _one_shot_kernel(t, scratch, flags, sync, ctrl, heap_bases, trace_buf, rank, world_size,
                     n, stride, half, fp, OP: tl.constexpr, BLOCK: tl.constexpr, TRACE: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = begin_epoch(sync)
    slots = scratch_half(scratch, epoch, half)
    t0 = trd.begin(TRACE)
    for blk in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(t + offs, mask=mask)
        for i in range(1, world_size):
            tdl.store(slots + rank * stride + offs, x, rank, (rank + i) % world_size,
                      heap_bases, mask=mask)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    ok = exchange(flags, DATA, epoch, ctrl, rank, world_size, heap_bases,
                  OP_ALL_REDUCE, fp, trace_buf, TRACE)
    t0 = trd.begin(TRACE)
    for blk in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        acc = reduce_slots(t, slots, stride, offs, mask, rank, world_size, OP)
        tl.store(t + offs, poison(acc.to(t.dtype.element_ty), ok), mask=mask)
    trd.end(trace_buf, t0, tags.REDUCE, rank, TRACE)


def one_shot(ctx, plan, t, op_code: int, block=None, programs=None):
    """In place on `t` (contiguous, checked by the caller)."""
    n = t.numel()
    common.launch_push(ctx, plan, _one_shot_kernel, (t,), (), n, t.dtype,
                       (n, str(t.dtype), op_code), block, programs, OP=op_code)
