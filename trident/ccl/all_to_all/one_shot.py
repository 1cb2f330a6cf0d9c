"""One-shot all-to-all (even or uneven splits) for small messages: every rank stores the
rows it has for peer p into its own slot of p's scratch, then each rank copies the slots
into its output.

One NVLink hop and one round trip (push needs two: it must learn where each peer's
output is and that the peer entered the call). No handshake before sending: slot s of
this launch's scratch half is reserved for sender s (see "Scratch halves" in device.py),
and every rank knows where the rows it receives go (out_splits). The data moves twice,
over NVLink and then through a local copy, so push wins for large messages. Estimate
(not yet measured): the round trip saved is worth the 13.4 vs 5.1 us that push
all_to_all and push all_gather take at 1 KiB in a graph (2x H200); the copy costs two
bytes of HBM traffic per byte received, about 0.7 us per MiB, so one_shot should win up
to about 1 MiB per rank (the all_gather push/pull crossover), which its 1 MiB slots hold.
Works on any tensors, nothing is staged.

A slot holds SLOT_BYTES (less its count header); per-peer messages larger than that are
clipped and the ranks that sent or expected them raise ValueError after the launch (the
other ranks' results are right). Each slot's header carries the count the sender sent;
one that differs from the receiver's out_splits is clipped and flagged, as in push.
"""
import torch
import triton
import triton.language as tl

import trident.language as tdl
from trident.trace import device as trd, kernel_args, tags

from .. import common
from ..device import (DATA, MAX_PROGRAMS, OP_ALL_TO_ALL, begin_epoch, notify_all, scratch_half,
                      wait_all)
from .rows import alignment, check_no_overlap, copy_rows, matched, splits_tensor

# Scratch per peer and launch: as large as the messages the selector gives one_shot
# (GPU); small on the CPU emulation so that tests reach the limit.
GPU_SLOT_BYTES, CPU_SLOT_BYTES = 1 << 20, 1 << 16
HEADER_BYTES = int(MAX_PROGRAMS) * 8      # per slot: one int64 count per program


@triton.jit
def _place(out, src, count, splits, src_rank, check, rank, world_size, heap_bases,
           BLOCK: tl.constexpr, ALIGN: tl.constexpr):
    """Copy `count` elements from local `src` to where out_splits puts the rows of
    `src_rank` in `out` (clipped to, and checked against, the count expected)."""
    count = matched(count, tl.load(splits + 3 * world_size + src_rank), check)
    dst = out + tl.multiple_of(tl.load(splits + 2 * world_size + src_rank), ALIGN)
    copy_rows(dst, src, count, rank, rank, heap_bases, BLOCK, ALIGN, False)


@triton.jit
def _one_shot_kernel(out, inp, splits, slots, counts, check, flags, sync, ctrl, heap_bases,
                     trace_buf, rank, world_size, half, counts_half, stride,
                     BLOCK: tl.constexpr, ALIGN: tl.constexpr, TRACE: tl.constexpr):
    """splits (int64, in elements): [in_offsets | in_counts | out_offsets | out_counts].
    In this launch's scratch half, sender s's rows sit at slots + s * stride (at most
    `stride` elements) and counts[s * MAX_PROGRAMS + program] is how many it sent: each
    program of the sender writes the count that the same program of the receiver reads."""
    pid = tl.program_id(0)
    epoch = begin_epoch(sync)
    slots = scratch_half(slots, epoch, half)
    counts = scratch_half(counts, epoch, counts_half)
    t0 = trd.begin(TRACE)
    for i in range(1, world_size):
        peer = (rank + i) % world_size
        count = tl.load(splits + world_size + peer)
        src = inp + tl.multiple_of(tl.load(splits + peer), ALIGN)
        copy_rows(slots + rank * stride, src, tl.minimum(count, stride), rank, peer,
                  heap_bases, BLOCK, ALIGN, True)
        tdl.store(counts + rank * MAX_PROGRAMS + pid, count, rank, peer, heap_bases)
    notify_all(flags, DATA, epoch, rank, world_size, heap_bases)
    # own rows, while the peers' are in flight
    _place(out, inp + tl.multiple_of(tl.load(splits + rank), ALIGN),
           tl.load(splits + world_size + rank), splits, rank, check, rank, world_size,
           heap_bases, BLOCK, ALIGN)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    t0 = trd.begin(TRACE)
    wait_all(flags, DATA, epoch, ctrl, rank, world_size, OP_ALL_TO_ALL)
    trd.end(trace_buf, t0, tags.WAIT, rank, TRACE)
    t0 = trd.begin(TRACE)
    for i in range(1, world_size):
        src_rank = (rank + i) % world_size
        count = tl.load(counts + src_rank * MAX_PROGRAMS + pid, volatile=True)
        _place(out, slots + src_rank * stride, tl.minimum(count, stride), splits, src_rank,
               check, rank, world_size, heap_bases, BLOCK, ALIGN)
    trd.end(trace_buf, t0, tags.COPY, rank, TRACE)


def slot_bytes(ctx) -> int:
    return GPU_SLOT_BYTES if ctx.backend == "cuda" else CPU_SLOT_BYTES


def _too_large(nbytes: int, limit: int):
    def step(tensors):
        raise ValueError(f"all_to_all one_shot: a message of {nbytes} bytes to or from a peer "
                         f"exceeds its scratch slot ({limit} bytes) and was cut short; use "
                         f"algorithm='push' for messages this large")
    return step


def one_shot(ctx, plan, out, inp, out_splits, in_splits, row, block=None, programs=None):
    """out, inp: flat word views; splits in rows of `row` words (checked by the caller)."""
    check_no_overlap(out, inp)
    w, word = ctx.world_size, out.element_size()
    buf = common.scratch(ctx, 2 * w * slot_bytes(ctx), torch.uint8)
    half_bytes = buf.numel() // 2
    header = w * HEADER_BYTES                 # the counts come first in each half
    slots = buf[header:].view(out.dtype)
    stride = (half_bytes - header) // w // 64 * 64 // word        # 64-byte aligned slots
    st = common.state(ctx)
    splits = splits_tensor(ctx, in_splits, out_splits, row)
    block, grid = common.launch_size(ctx, 1 << 62, inp.element_size(), block, programs)
    trace_buf, trace = kernel_args(ctx)
    plan.launch(_one_shot_kernel, (grid,), out, inp, splits, slots, buf.view(torch.int64),
                st.a2a_check, st.flags, st.sync, ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank, w,
                half_bytes // word, half_bytes // 8, stride, BLOCK=block,
                ALIGN=alignment(row), TRACE=trace, **common.kernel_options(ctx))
    largest = max((n * row * word for p, n in enumerate(in_splits + out_splits)
                   if p % w != ctx.rank), default=0)
    if largest > stride * word:           # after the launch: the peers are not left waiting
        plan.add(_too_large(largest, stride * word), graphable=False)
