"""Direct push all-gather: every rank stores its block straight into every peer's output.

push.py goes through a scratch slot on every peer and a local copy out of it (an extra
HBM pass, and scratch of twice world x the block); pull.py reads over NVLink, which on
H200s tops out lower than writing (p2p, one peer: pull 333 GB/s, push 356). Here each
rank loads a block of its input once and stores it into segment `rank` of every rank's
output, its own included: each byte crosses NVLink once, as stores, and nothing is
copied afterwards.

Handshakes per program: ARRIVE first (a peer's output may be written once its owner
entered the call, and where that output lies on the peer's heap is published then:
publish_offset / peer_shift, as pull does with its input), then DATA (release after
this program's stores; a rank's output is complete once program p of every peer has
signalled, for every p: all ranks launch the same grid, and program p of each peer wrote
blocks p, p + G, ... of its segment). Nothing reads a peer afterwards, so no DONE.

The output must be on the heap (a plain one is staged through a heap buffer and copied
back); the input can be any tensor, including a view of the output (in place).
Knobs: block, programs, warps.
"""
import triton
import triton.language as tl

from trident.trace import kernel_args, tags

from .. import common
from ..device import (DATA, OP_ALL_GATHER, arrive, depart, fingerprint, peer_ptrs, peer_shifts,
                      poison_out, store_peers)


@triton.jit
def _blocks(out, inp, shifts, heap_bases, rank, n, WORLD: tl.constexpr, WORD: tl.constexpr,
            BLOCK: tl.constexpr, VEC: tl.constexpr):
    """This program's blocks of my input into segment `rank` of every rank's output."""
    ptrs, oks = peer_ptrs(out + rank * n, shifts, rank, heap_bases, WORLD, WORD, VEC)
    for blk in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        store_peers(ptrs, oks, offs, tl.load(inp + offs, mask=mask), mask, WORLD, VEC)


@triton.jit
def _push_direct_kernel(out, inp, offsets, my_offset, flags, sync, ctrl, heap_bases, trace_buf,
                        rank, n, fp, WORLD: tl.constexpr, WORD: tl.constexpr, BLOCK: tl.constexpr,
                        TRACE: tl.constexpr):
    epoch, ok, t0 = arrive(offsets, my_offset, flags, sync, ctrl, heap_bases, trace_buf, rank,
                           WORLD, OP_ALL_GATHER, fp, TRACE)
    shifts, aligned = peer_shifts(offsets, rank, my_offset, WORLD, WORD)
    if ok:                # else a peer is missing or made another call: touch no peer memory
        if aligned:
            _blocks(out, inp, shifts, heap_bases, rank, n, WORLD, WORD, BLOCK, True)
        else:
            _blocks(out, inp, shifts, heap_bases, rank, n, WORLD, WORD, BLOCK, False)
    ok = ok & depart(flags, DATA, epoch, ctrl, rank, WORLD, heap_bases, OP_ALL_GATHER,
                     trace_buf, t0, tags.SEND, TRACE)
    if not ok:            # the peers' blocks in my output may be missing
        poison_out(out, WORLD * n, BLOCK)


def push_direct(ctx, plan, out, inp, block=None, programs=None, warps=None):
    """out, inp: flat word views (checked by the caller); out has world * inp.numel()."""
    n = inp.numel()
    dst = common.stage(ctx, plan, out, 0, "stage.out", copy_in=False)
    st = common.state(ctx)
    block, grid = common.launch_size(ctx, n, inp.element_size(), block, programs)
    trace_buf, trace = kernel_args(ctx)
    plan.launch(
        _push_direct_kernel, (grid,), dst, inp, st.offsets, common.heap_offset(ctx, dst),
        st.flags, st.sync, ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank, n,
        fingerprint(_push_direct_kernel, n, dst.element_size()), WORLD=ctx.world_size, WORD=dst.element_size(), BLOCK=block, TRACE=trace,
        **common.kernel_options(ctx, warps))
    if dst is not out:
        if out.data_ptr() == plan.tensors[0].data_ptr():
            common.unstage(plan, 0, out, dst)
        else:
            # out is common.as_words' aligned stand-in (see broadcast/relay.py)
            plan.add(lambda ts: out.copy_(dst))
