"""One-shot all-to-all (even or uneven splits) for small messages: every rank stores the
rows it has for peer p into its own slot of p's scratch, then each rank copies the slots
into its output.

One NVLink hop and one signal per (pair, program), no handshake before sending: slot s of
this launch's scratch half is reserved for sender s (see "Scratch halves" in device.py),
and every rank knows where the rows it receives go (out_splits). The data moves twice,
over NVLink and then through a local copy, so push wins for large messages. Works on any
tensors, nothing is staged; one kernel launch per call.

Programs (rows.py, "Pairs and programs"). Program q serves one distance k = q % (w-1) + 1:
it sends to rank + k and receives from rank - k, as the pair's program v = q // (w-1).
So the w-1 peers are served by different programs in parallel (no program walks the peers
one after another), and the grid is what the rows need: w-1 programs for messages up to
one block per peer (the shape of all_gather's push at small sizes), up to
(w-1) * cap programs (cap = the launch size's program limit / (w-1)). Each rank sizes
its own grid from its own splits; the ranks need not agree on it.

The count travels with the data: the pair's program 0 writes the number of elements it
sent into a header word of the peer's scratch half, and the call's fingerprint (dtype, row
shape, launch size: ccl/device.py, "Call fingerprints") beside its flag, before the flag. The
receiver's programs of that pair wait for that flag and check both: a count that differs
from out_splits, or another call, is CallMismatch on the receiving rank (raised at its
next call; at the next barrier, or this call in debug mode, on every rank), and those
programs write all bits set (NaN) into the rows they would have copied, never a hang
(they wait for no other flag of the pair). A slot holds SLOT_BYTES; per-peer messages
larger than that are clipped and the ranks that sent or expected them raise ValueError
after the launch (the other ranks' results are right).

Even splits (every pair count of this rank the same: EVEN) read no split table: offsets
are peer * n, so the first loads of the kernel are the data.

What changed when its protocol was reworked, and what it was measured at before:
docs/history.md, "Notes moved out of the source".
"""
import torch
import triton
import triton.language as tl

import trident.language as tdl
from trident.trace import device as trd, kernel_args, tags

from .. import common
from ..device import (ARRIVE, DATA, MAX_RANKS, OP_ALL_TO_ALL, begin_epoch, fingerprint, fp_slot,
                      poison_blocks, same_call, scratch_half)
from .rows import (alignment, check_no_overlap, copy_own_rows, copy_rows, even_count, grid_size,
                   pair_flag, pair_programs, rows_from, rows_to, splits_tensor)

# Scratch per peer and launch: as large as the messages the selector gives one_shot
# (GPU); small on the CPU emulation so that tests reach the limit.
GPU_SLOT_BYTES, CPU_SLOT_BYTES = 1 << 20, 1 << 16
HEADER_BYTES = int(MAX_RANKS) * 8        # per scratch half: one int64 count per sender


@triton.jit
def _one_shot_kernel(out, inp, splits, slots, counts, flags, sync, ctrl, heap_bases,
                     trace_buf, rank, world_size, n, half, counts_half, stride, cap, fp,
                     BLOCK: tl.constexpr, ALIGN: tl.constexpr, EVEN: tl.constexpr,
                     TRACE: tl.constexpr):
    """splits (int64, in elements): [in_offsets | in_counts | out_offsets | out_counts],
    unused when EVEN (then every pair moves `n` elements). In this launch's scratch half,
    sender s's rows sit at slots + s * stride (at most `stride` elements) and counts[s] is
    how many it sent. `cap`: most programs per pair. `fp`: the call's fingerprint."""
    pid = tl.program_id(0)
    lanes = world_size - 1
    k = pid % lanes + 1                  # this program's distance: to rank+k, from rank-k
    v = pid // lanes                     # its index among the pair's programs
    epoch = begin_epoch(sync)
    slots = scratch_half(slots, epoch, half)
    counts = scratch_half(counts, epoch, counts_half)
    t0 = trd.begin(TRACE)
    # send: rows for rank+k, then the count and fingerprint (program 0 of the pair) and
    # the flag
    peer = (rank + k) % world_size
    count, src = rows_to(inp, splits, n, peer, world_size, ALIGN, EVEN)
    sent = tl.minimum(count, stride)
    senders = pair_programs(sent, BLOCK, cap)
    if v < senders:
        copy_rows(slots + rank * stride, src, sent, v, senders, rank, peer, heap_bases, BLOCK,
                  ALIGN, True)
        if v == 0:
            tdl.store(counts + rank, count, rank, peer, heap_bases)
            tdl.store(fp_slot(flags, epoch, rank, pid), tl.cast(fp, tl.int64), rank, peer,
                      heap_bases)
        tdl.signal(pair_flag(flags, DATA, rank, pid), epoch, rank, peer, heap_bases)
    # own rows, every program, while the peers' are in flight (the host checked that
    # in_splits and out_splits agree on them)
    copy_own_rows(out, inp, splits, n, rank, world_size, heap_bases, BLOCK, ALIGN, EVEN)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    # receive from rank-k: this program's blocks of its slot, once their flag is set
    src_rank = (rank + world_size - k) % world_size
    expect, dst = rows_from(out, splits, n, src_rank, world_size, ALIGN, EVEN)
    got = tl.minimum(expect, stride)
    used = pair_programs(got, BLOCK, cap)      # the pair's programs, if the counts agree
    if v < used:
        t0 = trd.begin(TRACE)
        # polled beside the peer's control block: its program 0's ARRIVE flag, which
        # one_shot never sets and push (and every wait_for kernel) sets after storing its
        # fingerprint, so a peer in this launch with push is a CallMismatch at once (its
        # programs wait for an ARRIVE of this rank's that never comes)
        ok = tdl.wait(pair_flag(flags, DATA, src_rank, k - 1), epoch, ctrl, rank, src_rank,
                      OP_ALL_TO_ALL, 0, pair_flag(flags, ARRIVE, src_rank, 0),
                      fp_slot(flags, epoch, src_rank, 0), fp, 1, 0)
        # the same call, and the count the sender sent is the one this rank expects
        # (else CallMismatch: the sender's programs and this rank's would not pair up)
        theirs = tl.load(fp_slot(flags, epoch, src_rank, k - 1), volatile=True)
        same = tl.load(counts + src_rank, volatile=True) == expect
        ok = same_call(tl.where(same, theirs, 0), fp, ok, ctrl, rank, src_rank, OP_ALL_TO_ALL)
        if ok & (v > 0):
            ok = tdl.wait(pair_flag(flags, DATA, src_rank, pid), epoch, ctrl, rank, src_rank,
                          OP_ALL_TO_ALL)
        trd.end(trace_buf, t0, tags.WAIT, rank, TRACE)
        t0 = trd.begin(TRACE)
        if ok:
            copy_rows(dst, slots + src_rank * stride, got, v, used, rank, rank, heap_bases,
                      BLOCK, ALIGN, False)
        else:       # a failed call never yields plausible rows (whole rows: as copy_rows)
            poison_blocks(dst, got // ALIGN * ALIGN, v, used, BLOCK)
        trd.end(trace_buf, t0, tags.COPY, rank, TRACE)


def slot_bytes(ctx) -> int:
    return GPU_SLOT_BYTES if ctx.backend == "cuda" else CPU_SLOT_BYTES


def _too_large(nbytes: int, limit: int):
    def step(tensors):
        raise ValueError(f"all_to_all one_shot: a message of {nbytes} bytes to or from a peer "
                         f"exceeds its scratch slot ({limit} bytes) and was cut short; use "
                         f"algorithm='push' for messages this large")
    return step


def one_shot(ctx, plan, out, inp, out_splits, in_splits, row, call, block=None,
             programs=None):
    """out, inp: flat word views; splits in rows of `row` words (checked by the caller);
    `call`: what every rank's call must share (dtype, row shape) for the fingerprint."""
    check_no_overlap(out, inp)
    w, word = ctx.world_size, out.element_size()
    buf = common.scratch(ctx, 2 * w * slot_bytes(ctx), torch.uint8)
    half_bytes = buf.numel() // 2
    slots = buf[HEADER_BYTES:].view(out.dtype)          # the counts come first in each half
    stride = (half_bytes - HEADER_BYTES) // w // 64 * 64 // word    # 64-byte aligned slots
    st = common.state(ctx)
    n = even_count(in_splits, out_splits, row)
    splits = splits_tensor(ctx, in_splits, out_splits, row)
    block, limit = common.launch_size(ctx, 1 << 62, inp.element_size(), block, programs)
    cap = max(1, limit // (w - 1))
    grid = grid_size(ctx.rank, w, [c * row for c in in_splits], [c * row for c in out_splits],
                     stride, block, cap)
    trace_buf, trace = kernel_args(ctx)
    plan.launch(_one_shot_kernel, (grid,), out, inp, splits, slots, buf.view(torch.int64),
                st.flags, st.sync, ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank, w,
                n or 0, half_bytes // word, half_bytes // 8, stride, cap,
                fingerprint(_one_shot_kernel, word, block, cap, *call), BLOCK=block,
                ALIGN=alignment(row), EVEN=n is not None, TRACE=trace,
                **common.kernel_options(ctx))
    largest = max((c * row * word for p, c in enumerate(in_splits + out_splits)
                   if p % w != ctx.rank), default=0)
    if largest > stride * word:           # after the launch: the peers are not left waiting
        plan.add(_too_large(largest, stride * word), graphable=False)
