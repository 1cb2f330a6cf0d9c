"""Lamport one-shot all-reduce: every rank stores its tensor into its slot of every peer's
receive buffer, and each rank reduces the slots as their words arrive (ccl/lamport.py:
the data is its own ready flag).

It moves what one_shot moves, (world-1)*n per rank, in one kernel and one NVLink trip,
without one_shot's release fence and flag round, so it is the latency path for small
tensors (at most `ccl.lamport.capacity` bytes per rank: 1 MiB with the default heap); two_shot
wins once bandwidth matters. Floating dtypes only (bf16, fp16, fp32: the sentinel is a
float bit pattern); fp32 accumulation in rank order, so every rank gets bit-identical
results. A -0.0 of bf16/fp16 travels as +0.0 (and the fp32 denormal -4.59e-41 as +0.0).
"""
import triton
import triton.language as tl

from trident.trace import device as trd, tags

from .. import lamport as proto
from ..device import OP_ALL_REDUCE


@triton.jit
def _lamport_kernel(t, data, heads, lsync, fsync, ctrl, heap_bases, trace_buf, rank, n, slot,
                    fp, WORLD: tl.constexpr, OP: tl.constexpr, BLOCK: tl.constexpr,
                    TRACE: tl.constexpr, PDL: tl.constexpr):
    t0 = trd.begin(TRACE)
    epoch, buf, base, expect = proto.open_round(data, lsync, slot, fp, WORLD, PDL)
    pid, programs = tl.program_id(0), tl.num_programs(0)
    for blk in range(pid, tl.cdiv(n, BLOCK), programs):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        words = proto.to_words(tl.load(t + offs, mask=mask))
        proto.send(base + rank * slot, words, offs, mask, rank, heap_bases, WORLD)
    heads_row, ok, t0 = proto.sent(heads, buf, expect, rank, heap_bases, trace_buf, t0, WORLD,
                                   TRACE)
    proto.receive_blocks(t, t, base, slot, heads_row, expect, ok, ctrl, fsync, rank, heap_bases,
                         n, OP, WORLD, OP_ALL_REDUCE, BLOCK)
    proto.clear_heads(heads_row, rank, WORLD)
    proto.end(lsync, epoch)
    trd.end(trace_buf, t0, tags.REDUCE, rank, TRACE)


def fits(ctx, nbytes: int) -> bool:
    """Whether `nbytes` per rank is within what this context's Lamport buffers take
    (registry.py: "auto" passes over it otherwise)."""
    return nbytes <= proto.limit(ctx, "all_reduce")


def check(ctx, t) -> None:
    """ValueError/TypeError unless `t` can go this way (its dtype and size: the same on
    every rank, so every rank raises alike)."""
    proto.check(ctx, "all_reduce", t.dtype, t.numel() * t.element_size(), "one_shot",
                "'one_shot' or 'two_shot'")


def lamport(ctx, plan, t, op_code: int, block=None, programs=None, warps=None):
    """In place on `t` (contiguous, checked by the caller)."""
    check(ctx, t)
    proto.launch(ctx, plan, _lamport_kernel, (t,), t.dtype, t.numel(),
                 (t.numel(), str(t.dtype), op_code), block, programs, warps, OP=op_code)
