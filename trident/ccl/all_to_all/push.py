"""Push all-to-all (even or uneven splits): every rank stores the rows it has for peer p
straight into p's output, at the place p announced.

Each rank's program 0 first writes, into every peer, where that peer's rows go in its
own output and how many it expects, then sets that peer's ARRIVE flag (the output may be
written once its owner entered the call). Then data moves once over NVLink, with no
scratch and no copy, and each program that moved rows for a peer sets one DATA flag
there; a rank is done when the flags of every program that writes into its output are
set. Two one-way trips (announcement, data + flag), so for small messages one_shot (one
trip and a local copy) wins; push wins once that copy costs more than the announcement.

Programs (rows.py, "Pairs and programs"). The grid is the launch size's full grid G, the
same on every rank. The pair at distance k (rank -> rank + k) uses the programs of its
section: program (k-1)*G/(w-1) + v for its v = 0 .. U-1 (mod G), U = pair_programs(the
receiver's count), which the sender reads from the announcement and the receiver knows
from out_splits. So for mid-size messages different peers are fed by different programs
in parallel; for large ones (U = G) every program feeds every peer, each starting with the
peer of its own section: at any moment about G/(w-1) programs write to each peer, every
outgoing link is busy and no destination takes every program's stores at once.

Announcements are double-buffered by epoch parity (the buffer is also the anchor): a
program that moves nothing for a peer still reads its announcement, possibly after the
peer finished the launch; the peer cannot write the same half again before this rank
finished it (it waits for a DATA flag of this rank in the launch in between).

Places are offsets from the anchor, a buffer at the same heap offset on every rank, so
each rank's output may sit anywhere on its heap. An output that is not on the heap is
staged (a zero-row one needs nothing). The input can be any tensor.

Call fingerprints (ccl/device.py): program 0 stores the call's (dtype, row shape, launch
size) beside its ARRIVE flag. A sender whose peer made another call, or expects a count
other than the one it has for it, records CallMismatch and its program moves nothing more
to any peer; the peer's waits for its DATA flags then stop on its error word (PeerFailed)
and the rows they guard are poisoned (all bits set: NaN), as are those of a sender that
never came (a timeout). Never a hang, never rows clipped or left as they were.

What changed when its protocol was reworked, and what it was measured at before:
docs/history.md, "Notes moved out of the source".
"""
import torch
import triton
import triton.language as tl

import trident.language as tdl
from trident.trace import device as trd, kernel_args, tags

from .. import common
from ..device import (ARRIVE, DATA, MAX_RANKS, OP_ALL_TO_ALL, begin_epoch, fingerprint,
                      fp_slot, poison_blocks, same_call)
from .rows import alignment, check_no_overlap, copy_rows, pair_flag, pair_programs, \
    splits_tensor


@triton.jit
def _push_kernel(anchor, inp, splits, meta, flags, sync, ctrl, heap_bases, trace_buf,
                 rank, world_size, fp, BLOCK: tl.constexpr, ALIGN: tl.constexpr,
                 TRACE: tl.constexpr):
    """splits (int64, in elements): [in_offsets | in_counts | out_offsets | out_counts],
    out offsets from `anchor`. meta: two halves of [offset, count] per sender. `fp`: the
    call's fingerprint."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    lanes = world_size - 1
    epoch = begin_epoch(sync)
    meta = meta + (epoch % 2) * (2 * MAX_RANKS)
    t0 = trd.begin(TRACE)
    if pid == 0:
        for i in range(1, world_size):
            peer = (rank + i) % world_size
            tdl.store(meta + 2 * rank, tl.load(splits + 2 * world_size + peer), rank, peer,
                      heap_bases)
            tdl.store(meta + 2 * rank + 1, tl.load(splits + 3 * world_size + peer), rank, peer,
                      heap_bases)
            tdl.store(fp_slot(flags, epoch, rank, 0), tl.cast(fp, tl.int64), rank, peer,
                      heap_bases)
            tdl.signal(pair_flag(flags, ARRIVE, rank, 0), epoch, rank, peer, heap_bases)
    # own rows, while the announcements are in flight (the host checked that in_splits
    # and out_splits agree on them)
    count = tl.load(splits + world_size + rank)
    own = inp + tl.multiple_of(tl.load(splits + rank), ALIGN)
    mine = tl.load(splits + 2 * world_size + rank)     # out offsets count from the anchor:
    if mine % ALIGN == 0:                              # aligned only if out is, as below
        copy_rows(anchor + mine // ALIGN * ALIGN, own, count, pid, grid, rank, rank,
                  heap_bases, BLOCK, ALIGN, False)
    else:
        copy_rows(anchor + mine, own, count, pid, grid, rank, rank, heap_bases, BLOCK, ALIGN,
                  False)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    ok = tl.cast(1, tl.int1)                        # no wait of this program failed yet
    first = pid * lanes // grid                     # the section this program is in
    for i in range(0, lanes):
        k = (first + i) % lanes + 1
        peer = (rank + k) % world_size
        v = (pid - (k - 1) * grid // lanes + grid) % grid
        t0 = trd.begin(TRACE)
        came = tdl.wait(pair_flag(flags, ARRIVE, peer, 0), epoch, ctrl, rank, peer,
                        OP_ALL_TO_ALL)
        trd.end(trace_buf, t0, tags.WAIT, rank, TRACE)
        expect = tl.load(meta + 2 * peer + 1, volatile=True)
        count = tl.load(splits + world_size + peer)
        # the same call, expecting the rows this rank sends (else CallMismatch, and this
        # program touches no peer's memory from here on: the peer stops on this rank's
        # error word)
        theirs = tl.load(fp_slot(flags, epoch, peer, 0), volatile=True)
        ok = ok & same_call(tl.where(count == expect, theirs, 0), fp, came, ctrl, rank, peer,
                            OP_ALL_TO_ALL)
        used = pair_programs(expect, BLOCK, grid)
        if ok & (v < used):
            t0 = trd.begin(TRACE)
            src = inp + tl.multiple_of(tl.load(splits + peer), ALIGN)
            dst = tl.load(meta + 2 * peer, volatile=True)
            if dst % ALIGN == 0:        # the peer's output is aligned: keep vector accesses
                # (dst // ALIGN * ALIGN, not tl.multiple_of(dst): that would mark the load
                # itself, and the other branch with it)
                copy_rows(anchor + dst // ALIGN * ALIGN, src, count, v, used, rank, peer,
                          heap_bases, BLOCK, ALIGN, True)
            else:
                copy_rows(anchor + dst, src, count, v, used, rank, peer, heap_bases, BLOCK,
                          ALIGN, True)
            tdl.signal(pair_flag(flags, DATA, rank, pid), epoch, rank, peer, heap_bases)
            trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    # done once every program that writes into my output (same id as mine) has signalled;
    # the rows of a sender whose flag never came are poisoned (all bits set: NaN), and so
    # are all of them after a failed announcement: a peer in another call (one_shot) may
    # set these flags without writing my output
    t0 = trd.begin(TRACE)
    for k in range(1, world_size):
        src_rank = (rank + world_size - k) % world_size
        v = (pid - (k - 1) * grid // lanes + grid) % grid
        expect = tl.load(splits + 3 * world_size + src_rank)
        used = pair_programs(expect, BLOCK, grid)
        if v < used:
            came = ok
            if came:
                came = tdl.wait(pair_flag(flags, DATA, src_rank, pid), epoch, ctrl, rank,
                                src_rank, OP_ALL_TO_ALL)
            if not came:
                poison_blocks(anchor + tl.load(splits + 2 * world_size + src_rank), expect, v,
                              used, BLOCK)
    trd.end(trace_buf, t0, tags.WAIT, rank, TRACE)


def _meta(ctx) -> torch.Tensor:
    """Announcements, two halves of [offset, count] per sender; also the anchor."""
    return ctx.workspace("ccl.a2a_push_meta",
                         lambda c: c.zeros(4 * int(MAX_RANKS), dtype=torch.int64))


def push(ctx, plan, out, inp, out_splits, in_splits, row, call, block=None, programs=None,
         warps=None):
    """out, inp: flat word views; splits in rows of `row` words (checked by the caller);
    `call`: what every rank's call must share (dtype, row shape) for the fingerprint.
    warps: a knob (common.py)."""
    check_no_overlap(out, inp)
    st = common.state(ctx)
    meta = _meta(ctx)
    anchor = meta.view(out.dtype)
    # A zero-row output receives nothing: its pointer (null) is never used. A plain one is
    # staged all the same, so that every rank creates the same staging workspaces in the
    # common case (outputs up to the smallest scratch size class); a zero-row view of a
    # heap tensor (data_ptr() is 0, so not "symmetric") is not.
    heap_view = out.untyped_storage().data_ptr() == anchor.untyped_storage().data_ptr()
    dst = out if heap_view and not out.numel() else \
        common.stage(ctx, plan, out, 0, "stage.out", copy_in=False)
    base = (dst.data_ptr() - anchor.data_ptr()) // out.element_size() if out.numel() else 0
    splits = splits_tensor(ctx, in_splits, out_splits, row, base)
    # The grid must be the same on every rank (the pairs' sections are fractions of it),
    # and splits are known only locally: always the full grid.
    block, grid = common.launch_size(ctx, 1 << 62, inp.element_size(), block, programs)
    trace_buf, trace = kernel_args(ctx)
    plan.launch(_push_kernel, (grid,), anchor, inp, splits, meta, st.flags,
                st.sync, ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank, ctx.world_size,
                fingerprint(_push_kernel, out.element_size(), block, grid, *call), BLOCK=block,
                ALIGN=alignment(row), TRACE=trace,
                **common.kernel_options(ctx, warps))
    if out.numel():
        common.unstage(plan, 0, out, dst)
