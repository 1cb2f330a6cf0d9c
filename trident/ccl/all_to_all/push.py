"""Push all-to-all (even or uneven splits): every rank stores the rows it has for peer p
straight into p's output, at the offset p announced.

Each rank first writes, into every peer, where that peer's rows go in its own output
and how many it expects (this doubles as the ARRIVE handshake: the output may be
written once its owner entered the call); then data moves once over NVLink, with no
scratch and no copy. The output must be on the heap (a plain tensor is staged); the
input can be any tensor. A count that differs from what the receiver expects is
clipped and flagged (raised as ValueError in debug mode).
"""
import torch
import triton
import triton.language as tl

import trident.language as tdl
from trident.trace import device as trd, kernel_args, tags

from .. import common
from ..device import ARRIVE, DATA, begin_epoch, exchange, notify, wait_all


@triton.jit
def _push_kernel(out, inp, splits, meta, check, flags, sync, ctrl, heap_bases, trace_buf,
                 rank, world_size, BLOCK: tl.constexpr, ALIGN: tl.constexpr,
                 TRACE: tl.constexpr):
    """splits (int64, in elements): [in_offsets | in_counts | out_offsets | out_counts]."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = begin_epoch(sync)
    t0 = trd.begin(TRACE)
    for i in range(1, world_size):
        peer = (rank + i) % world_size
        tdl.store(meta + 2 * rank, tl.load(splits + 2 * world_size + peer), rank, peer, heap_bases)
        tdl.store(meta + 2 * rank + 1, tl.load(splits + 3 * world_size + peer), rank, peer,
                  heap_bases)
        notify(flags, ARRIVE, epoch, rank, peer, heap_bases)
    wait_all(flags, ARRIVE, epoch, ctrl, rank, world_size, 5)
    trd.end(trace_buf, t0, tags.WAIT, rank, TRACE)
    t0 = trd.begin(TRACE)
    for i in range(world_size):
        peer = (rank + i) % world_size
        if i == 0:
            dst = tl.load(splits + 2 * world_size + rank)
            expect = tl.load(splits + 3 * world_size + rank)
        else:
            dst = tl.load(meta + 2 * peer, volatile=True)
            expect = tl.load(meta + 2 * peer + 1, volatile=True)
        count = tl.load(splits + world_size + peer)
        if count != expect:
            tl.atomic_xchg(check, 1)
            count = tl.minimum(count, expect)
        dst = tl.multiple_of(dst, ALIGN)
        src = tl.multiple_of(tl.load(splits + peer), ALIGN)
        for blk in range(pid, tl.cdiv(count, BLOCK), nprog):
            offs = blk * BLOCK + tl.arange(0, BLOCK)
            mask = offs < count
            x = tl.load(inp + src + offs, mask=mask)
            tdl.store(out + dst + offs, x, rank, peer, heap_bases, mask=mask)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    exchange(flags, DATA, epoch, ctrl, rank, world_size, heap_bases, 5, trace_buf, TRACE)


def _splits_tensor(ctx, in_splits, out_splits, row):
    """Offsets and counts in elements, uploaded once per distinct split (so that calls
    captured in a CUDA graph after a warm-up find it ready)."""
    cache = ctx.workspace("ccl.a2a_splits", lambda c: {})
    key = (tuple(in_splits), tuple(out_splits), row)
    if key not in cache:
        def offsets(counts):
            return [sum(counts[:i]) * row for i in range(len(counts))]
        values = (offsets(in_splits) + [c * row for c in in_splits]
                  + offsets(out_splits) + [c * row for c in out_splits])
        if len(cache) >= 256:
            cache.clear()
        cache[key] = torch.tensor(values, dtype=torch.int64, device=ctx.device)
    return cache[key]


def push(ctx, plan, out, inp, out_splits, in_splits, row, block=None, programs=None):
    """out, inp: flat word views; splits in rows of `row` words (checked by the caller)."""
    dst = common.stage(ctx, plan, out, 0, "stage.out", copy_in=False)
    st = common.state(ctx)
    splits = _splits_tensor(ctx, in_splits, out_splits, row)
    align = min(16, row & -row) if row else 1
    # The grid must be the same on every rank (program p waits for program p of its
    # peers), and splits are known only locally: always the full grid.
    block, grid = common.launch_size(ctx, 1 << 62, inp.element_size(), block, programs)
    trace_buf, trace = kernel_args(ctx)
    plan.launch(_push_kernel, (grid,), dst, inp, splits, st.a2a_meta, st.a2a_check, st.flags, st.sync,
                          ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank, ctx.world_size,
                          BLOCK=block, ALIGN=align, TRACE=trace, **common.kernel_options(ctx))
    common.unstage(plan, 0, out, dst)
