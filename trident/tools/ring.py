"""A traced ring exchange: every rank sends a tensor to the next rank and receives the
previous rank's. The demo op of `trident trace ring`, and the kernel the tracing tests
and the overhead measurement use -- it has all the phases a collective has.

Each program moves one BLOCK-sized chunk:
  wait  until the next rank acknowledged the previous call (its receive buffer is free)
  send  push the chunk into the next rank's receive buffer, then signal it (epoch)
  wait  until the previous rank's chunk arrived
  copy  receive buffer -> out, then acknowledge to the previous rank
all inside one "kernel" event per program. Flags carry the call's epoch, so no reset
kernel is needed between calls.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import language as tdl
from ..trace import device as trd
from ..trace import kernel_args, tags

BLOCK = 1024


@triton.jit
def _ring_kernel(inp, recv, out, ready, acks, ctrl, trace_buf, rank, world_size, heap_bases,
                 n, epoch, BLOCK: tl.constexpr, TRACE: tl.constexpr):
    pid = tl.program_id(0)
    nxt = (rank + 1) % world_size
    prv = (rank + world_size - 1) % world_size
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    t_kernel = trd.begin(TRACE)

    t = trd.begin(TRACE)
    tdl.wait(acks + pid, epoch - 1, ctrl, rank, nxt)
    trd.end(trace_buf, t, tags.WAIT, rank, TRACE)

    t = trd.begin(TRACE)
    tdl.put(recv + offs, inp + offs, rank, nxt, heap_bases, mask=mask)
    tdl.signal(ready + pid, epoch, rank, nxt, heap_bases)
    trd.end(trace_buf, t, tags.SEND, rank, TRACE)

    t = trd.begin(TRACE)
    tdl.wait(ready + pid, epoch, ctrl, rank, prv)
    trd.end(trace_buf, t, tags.WAIT, rank, TRACE)

    t = trd.begin(TRACE)
    tl.store(out + offs, tl.load(recv + offs, mask=mask), mask=mask)
    tdl.signal(acks + pid, epoch, rank, prv, heap_bases)
    trd.end(trace_buf, t, tags.COPY, rank, TRACE)

    trd.end(trace_buf, t_kernel, tags.KERNEL, rank, TRACE)


class _RingBuffers:
    """Receive buffer and per-program flags, kept in the context's workspace."""

    def __init__(self, ctx, n: int, dtype: torch.dtype):
        programs = triton.cdiv(n, BLOCK)
        self.recv = ctx.empty(n, dtype=dtype)
        self.ready = ctx.zeros(programs, dtype=torch.int64)
        self.acks = ctx.zeros(programs, dtype=torch.int64)
        self.epoch = 0
        # A peer may signal into our flags right after its own buffers exist: ours must be
        # zeroed before that, or the zeroing erases its signal and we wait forever.
        ctx.barrier()

    def reset(self) -> None:
        self.ready.zero_()
        self.acks.zero_()
        self.epoch = 0


def ring_exchange(ctx, out: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
    """out = the `inp` of rank (rank - 1) % world_size. Every rank calls it with the same
    shape and dtype. Returns out."""
    for name, t in (("out", out), ("inp", inp)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"ring_exchange: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != ctx.device or not t.is_contiguous():
            raise ValueError(f"ring_exchange: {name} must be a contiguous tensor on {ctx.device}")
    if out.shape != inp.shape or out.dtype != inp.dtype:
        raise ValueError(f"ring_exchange: out {tuple(out.shape)} {out.dtype} must match "
                         f"inp {tuple(inp.shape)} {inp.dtype}")
    n = inp.numel()
    bufs = ctx.workspace(("trace.ring", n, inp.dtype), lambda c: _RingBuffers(c, n, inp.dtype))
    bufs.epoch += 1
    trace_buf, enabled = kernel_args(ctx)
    _ring_kernel[(triton.cdiv(n, BLOCK),)](
        inp, bufs.recv, out, bufs.ready, bufs.acks, ctx.ctrl, trace_buf, ctx.rank,
        ctx.world_size, ctx.heap_bases, n, bufs.epoch, BLOCK=BLOCK, TRACE=enabled)
    ctx.after_op()
    return out
