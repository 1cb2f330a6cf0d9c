"""Push all-to-all (even or uneven splits): every rank stores the rows it has for peer p
straight into p's output, at the place p announced.

Each rank first writes, into every peer, where that peer's rows go in its own output
and how many it expects (this doubles as the ARRIVE handshake: the output may be
written once its owner entered the call); then data moves once over NVLink, with no
scratch and no copy. Two round trips, so for small messages one_shot (one round trip
and a local copy) wins; push wins once that copy costs more than the handshake.

Places are offsets from an anchor, a buffer at the same heap offset on every rank, so
each rank's output may sit anywhere on its heap. An output that is not on the heap is
staged (a zero-row one needs nothing). The input can be any tensor. A count that differs
from what the receiver expects is clipped and flagged (raised as ValueError in debug mode).
"""
import triton
import triton.language as tl

import trident.language as tdl
from trident.trace import device as trd, kernel_args, tags

from .. import common
from ..device import ARRIVE, DATA, OP_ALL_TO_ALL, begin_epoch, exchange, notify, wait_all
from .rows import alignment, check_no_overlap, copy_rows, matched, splits_tensor


@triton.jit
def _push_kernel(anchor, inp, splits, meta, check, flags, sync, ctrl, heap_bases, trace_buf,
                 rank, world_size, BLOCK: tl.constexpr, ALIGN: tl.constexpr,
                 TRACE: tl.constexpr):
    """splits (int64, in elements): [in_offsets | in_counts | out_offsets | out_counts],
    out offsets from `anchor`."""
    epoch = begin_epoch(sync)
    t0 = trd.begin(TRACE)
    for i in range(1, world_size):
        peer = (rank + i) % world_size
        tdl.store(meta + 2 * rank, tl.load(splits + 2 * world_size + peer), rank, peer, heap_bases)
        tdl.store(meta + 2 * rank + 1, tl.load(splits + 3 * world_size + peer), rank, peer,
                  heap_bases)
        notify(flags, ARRIVE, epoch, rank, peer, heap_bases)
    # own rows, while the peers' announcements are in flight
    count = matched(tl.load(splits + world_size + rank), tl.load(splits + 3 * world_size + rank),
                    check)
    copy_rows(anchor + tl.multiple_of(tl.load(splits + 2 * world_size + rank), ALIGN),
              inp + tl.multiple_of(tl.load(splits + rank), ALIGN), count, rank, rank,
              heap_bases, BLOCK, ALIGN, False)
    wait_all(flags, ARRIVE, epoch, ctrl, rank, world_size, OP_ALL_TO_ALL)
    trd.end(trace_buf, t0, tags.WAIT, rank, TRACE)
    t0 = trd.begin(TRACE)
    for i in range(1, world_size):
        peer = (rank + i) % world_size
        count = matched(tl.load(splits + world_size + peer),
                        tl.load(meta + 2 * peer + 1, volatile=True), check)
        src = inp + tl.multiple_of(tl.load(splits + peer), ALIGN)
        dst = tl.load(meta + 2 * peer, volatile=True)
        if dst % ALIGN == 0:        # the peer's output is aligned: keep vector accesses
            # (dst // ALIGN * ALIGN, not tl.multiple_of(dst): that would mark the load
            # itself, and the other branch with it)
            copy_rows(anchor + dst // ALIGN * ALIGN, src, count, rank, peer, heap_bases,
                      BLOCK, ALIGN, True)
        else:
            copy_rows(anchor + dst, src, count, rank, peer, heap_bases, BLOCK, ALIGN, True)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    exchange(flags, DATA, epoch, ctrl, rank, world_size, heap_bases,
             OP_ALL_TO_ALL, trace_buf, TRACE)


def push(ctx, plan, out, inp, out_splits, in_splits, row, block=None, programs=None):
    """out, inp: flat word views; splits in rows of `row` words (checked by the caller)."""
    check_no_overlap(out, inp)
    st = common.state(ctx)
    anchor = st.a2a_meta.view(out.dtype)
    # A zero-row output receives nothing: its pointer (null) is never used. A plain one is
    # staged all the same, so that every rank creates the same staging workspaces in the
    # common case (outputs up to the smallest scratch size class); a zero-row view of a
    # heap tensor (data_ptr() is 0, so not "symmetric") is not.
    heap_view = out.untyped_storage().data_ptr() == anchor.untyped_storage().data_ptr()
    dst = out if heap_view and not out.numel() else \
        common.stage(ctx, plan, out, 0, "stage.out", copy_in=False)
    base = (dst.data_ptr() - anchor.data_ptr()) // out.element_size() if out.numel() else 0
    splits = splits_tensor(ctx, in_splits, out_splits, row, base)
    # The grid must be the same on every rank (program p waits for program p of its
    # peers), and splits are known only locally: always the full grid.
    block, grid = common.launch_size(ctx, 1 << 62, inp.element_size(), block, programs)
    trace_buf, trace = kernel_args(ctx)
    plan.launch(_push_kernel, (grid,), anchor, inp, splits, st.a2a_meta, st.a2a_check, st.flags,
                st.sync, ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank, ctx.world_size,
                BLOCK=block, ALIGN=alignment(row), TRACE=trace, **common.kernel_options(ctx))
    if out.numel():
        common.unstage(plan, 0, out, dst)
