"""Relay broadcast: a pipelined scatter + all-gather, straight into every rank's tensor.

Scheme. The tensor is cut into chunks of `chunk` elements (chunk c = elements
[c*chunk, (c+1)*chunk)); chunk c has a relay, the (c mod (world-1))-th rank after the
source. Program p of every rank handles chunks p, p + P, p + 2P, ... (iteration k =
chunk p + kP), so each program sees the same chunk sequence on every rank:
  - the source stores chunk c into its relay's tensor, then raises its flag on the relay
    (one flag per (source, program) in a buffer of this algorithm, value
    epoch * 2**32 + k + 1: grows from launch to launch and from iteration to iteration,
    so it is never reset and a CUDA-graph replay needs nothing from the host);
  - the relay's program p waits for that value (acquire), then stores the chunk into
    the tensor of every other non-source rank. It starts on chunk c as soon as c has
    landed, while the source is still sending later chunks: the two hops overlap.
Non-relay receivers wait per chunk for nothing: the final DONE exchange (every rank
tells every peer, after its last store to it, that it is done; release/acquire) says
that all data has landed, and that no peer still writes into or reads this rank's
tensor, which keeps the ranks within one launch of each other (device.py). Before
anything is written, the ARRIVE exchange says that every peer entered the call (its
tensor is free to overwrite) and publishes where the tensor lies on each peer's heap
(heap tensors may sit at different offsets on different ranks: publish_offset,
peer_shift). At world 2 the peer relays every chunk to nobody: the source writes
straight into the peer's tensor and no chunk flags are used.

Deadlock freedom. Program p waits only on program p of its peers (ARRIVE, the source's
chunk flags, DONE); the source never waits on a relay inside the loop. So the
interpreter's one-program-after-another order and GPU grids larger than the chip are
both safe.

Traffic per link (n bytes, w ranks, all NVLink egress/ingress of one GPU): the source
sends n (each chunk once, spread over the w-1 relays); each relay receives n/(w-1) from
the source and sends (w-2)*n/(w-1); every non-source rank receives n in all. So every
GPU sends at most n, against (w-1)*n out of the source for push (broadcast/push.py),
and no rank holds scratch: any size that fits the heap works (a plain tensor is staged
through a heap buffer of its size). Time about n / NVLink rate + one chunk's forward
time + two handshakes.

When it wins: large tensors at 3+ ranks, where push is bound by the source's (w-1)*n
outgoing bytes (at w = 4 push tops out near 1/3 of the link rate) or cannot run (its
scratch is twice the tensor). Small tensors pay the ARRIVE round trip and the extra
hop: push wins there. At 2 ranks both move n bytes once; relay skips push's
scratch-to-tensor copy but waits for ARRIVE first. The selector picks it only where
`trident bench ccl` measured it fastest (tables.json).
"""
import torch
import triton
import triton.language as tl

import trident.language as tdl
from trident.trace import device as trd, kernel_args, tags

from .. import common
from ..device import (ARRIVE, DONE, MAX_PROGRAMS, MAX_RANKS, OP_BROADCAST, begin_epoch,
                      exchange, fingerprint, peer_shift, poison_out, publish_offset, shift_ok,
                      vec_aligned, vec_shift)

ITER_BITS = tl.constexpr(32)    # flag = epoch << ITER_BITS + iteration + 1
# Default chunk: about DEPTH chunks per program (so that the relay's hop overlaps the
# source's sends), at least one block and at most MAX_CHUNK_BYTES (1 MiB: 128 programs x
# 4 chunks = 512 MiB tensors still pipeline at 1 MiB chunks; signals stay rare).
DEPTH = 4
MAX_CHUNK_BYTES = 1 << 20
# Deeper from 32 MiB: measured on 4x H200 from a CUDA graph (figures: docs/history.md, "Notes moved out of the source").
DEPTH_BY_SIZE = ((32 << 20, 8), (128 << 20, 16))     # (from bytes, depth), ascending


def default_depth(nbytes: int) -> int:
    """DEPTH below 32 MiB, then DEPTH_BY_SIZE's measured depths."""
    depth = DEPTH
    for start, d in DEPTH_BY_SIZE:
        if nbytes >= start:
            depth = d
    return depth


class ChunkFlags:
    """This algorithm's flags: one int64 per (source rank, program) on every rank, set by
    the source to epoch << ITER_BITS + iteration + 1. Kept apart from the shared flags,
    whose values are epochs: these, far larger, would satisfy their later waits at once.
    A workspace, so ctx.reset() zeroes them with the epoch."""

    def __init__(self, ctx):
        self.flags = ctx.zeros(MAX_RANKS * MAX_PROGRAMS, dtype=torch.int64)

    def reset(self):
        self.flags.zero_()


@triton.jit
def _store_blocks(dst, t, lo, n, ok, CHUNK_BLOCKS, BLOCK: tl.constexpr):
    """My t[lo : lo + CHUNK_BLOCKS * BLOCK] (clipped at n) into `dst` (a peer's tensor,
    translated and shifted)."""
    for b in range(CHUNK_BLOCKS):
        offs = lo + b * BLOCK + tl.arange(0, BLOCK)
        mask = (offs < n) & ok
        tl.store(dst + offs, tl.load(t + offs, mask=mask), mask=mask)


@triton.jit
def _put_chunk(t, lo, n, offsets, my_offset, rank, peer, heap_bases, CHUNK_BLOCKS,
               WORD: tl.constexpr, BLOCK: tl.constexpr):
    """Store a chunk of my tensor into `peer`'s, wherever it lies on the peer's heap:
    16-byte accesses when the shift allows (device.py: "Vector accesses")."""
    shift = peer_shift(offsets, peer, rank, my_offset, WORD)
    if vec_aligned(shift, WORD):
        _store_blocks(tdl.translate(t + vec_shift(shift, WORD), rank, peer, heap_bases), t, lo,
                      n, True, CHUNK_BLOCKS, BLOCK)
    else:
        _store_blocks(tdl.translate(t + shift, rank, peer, heap_bases), t, lo, n,
                      shift_ok(shift), CHUNK_BLOCKS, BLOCK)


@triton.jit
def _relay_kernel(t, offsets, my_offset, chunk_flags, flags, sync, ctrl, heap_bases, trace_buf,
                  rank, world_size, src, n, chunk, fp, WORD: tl.constexpr, BLOCK: tl.constexpr,
                  TRACE: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = begin_epoch(sync)
    publish_offset(offsets, my_offset, rank, world_size, heap_bases)
    ok = exchange(flags, ARRIVE, epoch, ctrl, rank, world_size, heap_bases,
                  OP_BROADCAST, fp, trace_buf, TRACE)
    relays = world_size - 1
    base = epoch << ITER_BITS
    flag = chunk_flags + src * MAX_PROGRAMS + pid
    chunk = chunk // BLOCK * BLOCK        # unchanged (a multiple of BLOCK): for the compiler
    chunk_blocks = chunk // BLOCK
    t0 = trd.begin(TRACE)
    # a peer that is missing or made another call: no chunk moves (no peer memory touched)
    for c in range(pid, tl.cdiv(n, chunk) * ok.to(tl.int32), nprog):
        ready = base + (c - pid) // nprog + 1          # iteration + 1, this launch
        j = c % relays
        relay = (src + 1 + j) % world_size
        lo = c * chunk
        if rank == src:
            _put_chunk(t, lo, n, offsets, my_offset, rank, relay, heap_bases, chunk_blocks,
                       WORD, BLOCK)
            if relays > 1:
                tdl.signal(flag, ready, rank, relay, heap_bases)
        elif (rank == relay) & (relays > 1):
            tdl.wait(flag, ready, ctrl, rank, src, OP_BROADCAST)
            for i in range(1, relays):
                peer = (src + 1 + (j + i) % relays) % world_size
                _put_chunk(t, lo, n, offsets, my_offset, rank, peer, heap_bases, chunk_blocks,
                           WORD, BLOCK)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    ok = ok & exchange(flags, DONE, epoch, ctrl, rank, world_size, heap_bases,
                       OP_BROADCAST, 0, trace_buf, TRACE)
    if (not ok) & (rank != src):      # chunks of my copy may be missing
        poison_out(t, n, BLOCK)


def chunk_size(n: int, word: int, block: int, grid: int, depth: int = DEPTH) -> int:
    """Default chunk in elements of `word` bytes: the power-of-two multiple of `block`
    at or above n / (grid * depth), at most MAX_CHUNK_BYTES (and at least one block)."""
    want = block * triton.next_power_of_2(triton.cdiv(triton.cdiv(n, grid * depth), block))
    return max(block, min(want, MAX_CHUNK_BYTES // word // block * block))


def check_knobs(ctx, word: int, block=None, chunk=None, depth=None) -> None:
    """The depth and chunk knobs' checks, for words of `word` bytes (also made where no
    kernel runs: one rank, an empty tensor)."""
    if depth is not None and (not isinstance(depth, int) or depth < 1):
        raise ValueError(f"broadcast relay: depth must be a positive int, got {depth!r}")
    block = common.block_size(ctx, word, block)
    if chunk is not None and (chunk <= 0 or chunk % block):
        raise ValueError(f"broadcast relay: chunk must be a positive multiple of the block "
                         f"({block} elements), got {chunk}")


def check_options(ctx, word: int, block, chunk=None, depth=None, warps=None) -> None:
    """The knobs' values, for ccl/registry.py (before anything is launched)."""
    check_knobs(ctx, word, block, chunk, depth)


def relay(ctx, plan, t, src: int, block=None, programs=None, chunk=None, depth=None,
          warps=None):
    """t: a flat word view (checked by the caller). Knobs: chunk, elements per chunk (a
    multiple of the block); default about `depth` (default_depth) chunks per program, up to
    MAX_CHUNK_BYTES: the last chunk's second hop is not overlapped, so deeper pipelines
    leave a shorter tail at the price of more flags; warps (common.py)."""
    n, word = t.numel(), t.element_size()
    block, grid = common.launch_size(ctx, n, word, block, programs)
    check_knobs(ctx, word, block, chunk, depth)
    if chunk is None:
        chunk = chunk_size(n, word, block, grid, depth or default_depth(n * word))
    grid = min(grid, triton.cdiv(n, chunk))
    buf = common.stage(ctx, plan, t, 0, "stage.in", copy_in=ctx.rank == src)
    st = common.state(ctx)
    chunk_flags = ctx.workspace("ccl.broadcast.relay", ChunkFlags).flags
    trace_buf, trace = kernel_args(ctx)
    plan.launch(
        _relay_kernel, (grid,), buf, st.offsets, common.heap_offset(ctx, buf), chunk_flags,
        st.flags, st.sync, ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank, ctx.world_size, src,
        n, chunk, fingerprint(_relay_kernel, n, word, src, chunk), WORD=word, BLOCK=block, TRACE=trace, **common.kernel_options(ctx, warps))
    if ctx.rank != src and buf is not t:
        if t.data_ptr() == plan.tensors[0].data_ptr():
            common.unstage(plan, 0, t, buf)
        else:
            # t is common.as_words' aligned stand-in for the call's tensor, which it
            # copies back afterwards: the result goes into t (unstage would write the
            # call's tensor, and the stand-in's stale copy would then overwrite it)
            plan.add(lambda ts: t.copy_(buf))
