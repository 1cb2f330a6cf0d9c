"""Kernels with planted races for the sanitizer tests: copies of shipped kernels with one
synchronisation step taken out."""
import triton
import triton.language as tl

import trident.language as tdl
from trident.ccl.device import (DATA, MAX_PROGRAMS, NUM_REGIONS, OP_ALL_GATHER, begin_epoch,
                                notify_all, wait_all)


@triton.jit
def push_all_gather(out, inp, scratch, flags, sync, ctrl, heap_bases, rank, world_size, n,
                    stride, BLOCK: tl.constexpr, WAIT: tl.constexpr):
    """ccl/all_gather/push.py's kernel over one scratch half; WAIT=False drops the wait
    for the peers' DATA signal before the slots are read (the signal is still sent)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = begin_epoch(sync)
    for blk in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(inp + offs, mask=mask)
        for i in range(1, world_size):
            tdl.store(scratch + rank * stride + offs, x, rank, (rank + i) % world_size,
                      heap_bases, mask=mask)
        tl.store(out + rank * n + offs, x, mask=mask)
    notify_all(flags, DATA, epoch, rank, world_size, heap_bases, 3)       # fp: any, alike
    if WAIT:
        wait_all(flags, DATA, epoch, ctrl, rank, world_size, OP_ALL_GATHER, 3)
    for blk in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        for i in range(1, world_size):
            src = (rank + i) % world_size
            tl.store(out + src * n + offs, tl.load(scratch + src * stride + offs, mask=mask),
                     mask=mask)


def run_push_all_gather(ctx, inp, wait: bool, block: int = 16, programs: int = 2):
    """One launch of the kernel above on heap buffers made here; returns the output."""
    import torch
    n = inp.numel()
    stride = n
    scratch = ctx.zeros(ctx.world_size * stride, dtype=inp.dtype)
    flags = ctx.zeros(NUM_REGIONS.value * 64 * MAX_PROGRAMS.value, dtype=torch.int64)
    sync = torch.zeros(2, dtype=torch.int64)
    out = torch.empty(ctx.world_size * n, dtype=inp.dtype)
    ctx.barrier()            # every rank has zeroed its flags before any peer signals
    push_all_gather[(programs,)](out, inp, scratch, flags, sync, ctx.ctrl, ctx.heap_bases,
                                 ctx.rank, ctx.world_size, n, stride, BLOCK=block, WAIT=wait)
    return out


@triton.jit
def put_unordered(buf, val, out, heap_bases, rank, n, BLOCK: tl.constexpr):
    """Rank 0 stores `val` into rank 1's `buf` and rank 1 reads its `buf`, with no signal
    between them: a race of ranks 0 and 1 only (further ranks touch nothing)."""
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    if rank == 0:
        tdl.store(buf + offs, tl.load(val + offs, mask=mask), 0, 1, heap_bases, mask=mask)
    if rank == 1:
        tl.store(out + offs, tl.load(buf + offs, mask=mask), mask=mask)


def run_put_unordered(ctx, val):
    """One launch of put_unordered on a heap buffer made here; returns rank 1's read."""
    n = val.numel()
    buf = ctx.zeros(n, dtype=val.dtype)
    out = val.new_zeros(n)
    ctx.barrier()            # the buffer is zeroed everywhere before rank 0 writes
    put_unordered[(1,)](buf, val, out, ctx.heap_bases, ctx.rank, n,
                        BLOCK=triton.next_power_of_2(n))
    return out
