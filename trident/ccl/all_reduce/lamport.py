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
import torch
import triton
import triton.language as tl

from trident.trace import device as trd, tags

from .. import common, lamport as proto
from ..device import OP_ALL_REDUCE, fingerprint, poison

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
WARPS, BLOCK_BYTES = 4, 2048          # GPU default: 4 warps, 2 KiB a program per step


@triton.jit
def _lamport_kernel(t, data, heads, lsync, fsync, ctrl, heap_bases, trace_buf, rank, n, slot,
                    fp, WORLD: tl.constexpr, OP: tl.constexpr, BLOCK: tl.constexpr,
                    TRACE: tl.constexpr):
    t0 = trd.begin(TRACE)
    epoch = proto.begin(lsync)
    buf = epoch % 3
    base = data + buf * WORLD * slot              # this round's buffer, slot 0
    expect = proto.head(epoch, fp)
    pid, programs = tl.program_id(0), tl.num_programs(0)
    for blk in range(pid, tl.cdiv(n, BLOCK), programs):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        words = proto.to_words(tl.load(t + offs, mask=mask))
        proto.send(base + rank * slot, words, offs, mask, rank, heap_bases, WORLD)
    proto.send_heads(heads, buf, expect, rank, heap_bases, WORLD)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    t0 = trd.begin(TRACE)
    heads_row = heads + buf * WORLD * proto.MAX_PROGRAMS + pid
    ok = tl.cast(1, tl.int1)
    for blk in range(pid, tl.cdiv(n, BLOCK), programs):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        local = proto.canonical(tl.load(t + offs, mask=mask))
        acc, ok = proto.receive(base, slot, heads_row, local, offs, mask, expect, ok, ctrl,
                                  fsync, rank, heap_bases, OP, WORLD, OP_ALL_REDUCE)
        tl.store(t + offs, poison(acc.to(t.dtype.element_ty), ok), mask=mask)
    proto.clear_heads(heads_row, rank, WORLD)
    proto.end(lsync, epoch)
    trd.end(trace_buf, t0, tags.REDUCE, rank, TRACE)


def check(ctx, t) -> None:
    """ValueError/TypeError unless `t` can go this way (its dtype and size: the same on
    every rank, so every rank raises alike)."""
    if t.dtype not in DTYPES:
        raise TypeError(f"all_reduce algorithm 'lamport' reduces bfloat16, float16 and float32 "
                        f"(its ready sentinel is a float bit pattern), got {t.dtype}; use "
                        f"'one_shot'")
    cap = proto.capacity(common.agreed(ctx).heap_size, ctx.world_size)
    nbytes = t.numel() * t.element_size()
    if nbytes > cap:
        raise ValueError(f"all_reduce algorithm 'lamport' takes at most {cap} bytes per rank "
                         f"with this heap ({ctx.heap_size} bytes), got {nbytes}; use "
                         f"'one_shot' or 'two_shot'")


def lamport(ctx, plan, t, op_code: int, block=None, programs=None, warps=None):
    """In place on `t` (contiguous, checked by the caller)."""
    from ...trace import kernel_args
    check(ctx, t)
    n = t.numel()
    cap = proto.capacity(common.agreed(ctx).heap_size, ctx.world_size)
    ws = proto.state(ctx, cap)
    data, slot = ws.slots(t.dtype)
    fsync = common.state(ctx).sync
    if block is None and ctx.backend == "cuda":     # 16 bytes a thread: a short poll
        block = BLOCK_BYTES * (warps or WARPS) // 4 // t.element_size()
    block, grid = common.launch_size(ctx, n, t.element_size(), block, programs)
    trace_buf, trace = kernel_args(ctx)
    plan.launch(_lamport_kernel, (grid,), t, data, ws.heads, ws.sync, fsync, ctx.ctrl,
                ctx.heap_bases, trace_buf, ctx.rank, n, slot,
                fingerprint(_lamport_kernel, n, str(t.dtype), op_code),
                WORLD=ctx.world_size, OP=op_code, BLOCK=block, TRACE=trace,
                **common.kernel_options(ctx, warps or WARPS))
