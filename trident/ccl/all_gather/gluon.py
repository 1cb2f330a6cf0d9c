"""Gluon all-gather: push's protocol (push.py) with the copy loops written in Gluon, where
the register layout of a tile is stated rather than left to the compiler.

After Iris's Gluon all-gather (ROCm/iris PR 475): each program loads a tile of its input
once -- one 16-byte vector per thread per layout repetition, from a 1-D BlockedLayout of
16 // WORD words per thread -- and stores it `world` times: into its own output and into
its slot of every peer's scratch. The writes are staggered: the i-th store of every tile
goes to rank (rank + i) % world, so at any moment the ranks write to different peers.
Programs are persistent: grid = min(tiles, the SMs every rank may use: common.Agreed.sms),
each striding over the tiles. Iris recovers 2-D (row, column) indices of a BLOCK_M x BLOCK_N tile from a flat
1-D range by div/mod because it gathers columns of a 2-D tensor; here each rank's part is
one contiguous run of words (all_gather is along dim 0 of contiguous tensors), so the flat
tile is a run of BLOCK words and needs no div/mod.

Each peer's pointer is translated once per program, before the tile loop: the heap bases
are read once and the translated pointers stay in registers (Iris's PR hoisted its local
base out of the loop for the same reason). The flags, epochs and scratch halves are
push's (ccl/device.py), so the output is complete on every rank when the kernel ends on
the stream, and back-to-back calls and CUDA-graph replays need no reset.

When it wins: not measured yet (nothing of it has run on a GPU), so the selector never
picks it; `algorithm="gluon"` asks for it. Like push, it copies the slots out after the
DATA exchange (an extra HBM pass), which push_direct and pull avoid at large sizes.
Knobs: block, programs, warps.
"""
from triton.experimental.gluon import language as gl

import trident.language as tdl
from trident.language.gluon import jit
from trident.trace import device as trd, kernel_args, tags

from .. import common
from ..device import (DATA, MAX_PROGRAMS, OP_ALL_GATHER, begin_epoch, exchange, fingerprint,
                      poison, scratch_half)


@jit
def _gluon_kernel(out, inp, scratch, flags, sync, ctrl, heap_bases, trace_buf, rank, n, stride,
                  half, fp, WORLD: gl.constexpr, VEC: gl.constexpr, BLOCK: gl.constexpr,
                  WARPS: gl.constexpr, TRACE: gl.constexpr):
    # VEC words = 16 bytes per thread, 32 threads per warp, WARPS warps; a BLOCK larger than
    # that repeats the layout (each thread then holds BLOCK // (VEC * 32 * WARPS) vectors)
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    tiles = (n + BLOCK - 1) // BLOCK
    epoch = begin_epoch(sync)
    slots = scratch_half(scratch, epoch, half)
    # where the i-th store of a tile goes: my output (i = 0), then segment `rank` of the
    # slots of peer (rank + i) % WORLD -- translated once, not per tile
    dsts = (out + rank * n,)
    for i in gl.static_range(1, WORLD):
        dsts = dsts + (tdl.translate(slots + rank * stride, rank, (rank + i) % WORLD,
                                     heap_bases),)
    t0 = trd.begin(TRACE)
    for tile in range(pid, tiles, nprog):
        offs = tile * BLOCK + gl.arange(0, BLOCK, layout)
        mask = offs < n
        x = gl.load(inp + offs, mask=mask)
        for i in gl.static_range(WORLD):
            gl.store(dsts[i] + offs, x, mask=mask)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    # a peer that never came, or made another call (CallMismatch), leaves its part of the
    # output poisoned (all bits set: NaN), as push does
    ok = exchange(flags, DATA, epoch, ctrl, rank, WORLD, heap_bases, OP_ALL_GATHER, fp,
                  trace_buf, TRACE)
    t0 = trd.begin(TRACE)
    for tile in range(pid, tiles, nprog):
        offs = tile * BLOCK + gl.arange(0, BLOCK, layout)
        mask = offs < n
        for i in gl.static_range(1, WORLD):
            src = (rank + i) % WORLD
            x = gl.load(slots + src * stride + offs, mask=mask)
            gl.store(out + src * n + offs, poison(x, ok), mask=mask)
    trd.end(trace_buf, t0, tags.COPY, rank, TRACE)


def launch_size(ctx, n: int, word: int, block=None, programs=None, warps=None):
    """(BLOCK words, programs, warps): persistent programs, min(tiles, the SMs a grid may
    fill) on GPUs (common.launch_size's CPU limit on the emulation). The SMs are the
    ranks' agreed count (common.Agreed.sms, the smallest share of any rank), not this
    rank's own: program p waits for program p of every peer, so every rank launches the
    same grid. On GPUs the warps shrink until one layout repetition (16 bytes x 32
    threads x warps) fits in the block."""
    block = common.block_size(ctx, word, block)
    common.check_launch(block, programs)
    common.check_warps(warps)
    warps = warps or common.GPU_NUM_WARPS
    if ctx.backend == "cuda":
        limit = programs or min(common.agreed(ctx).sms, MAX_PROGRAMS.value)
        warps = max(1, min(warps, block * word // (16 * 32)))
    else:
        limit = programs or common.CPU_MAX_PROGRAMS
    return block, max(1, min(limit, -(-n // block))), warps


def gluon(ctx, plan, out, inp, block=None, programs=None, warps=None):
    """out, inp: flat word views (checked by the caller); out has world * inp.numel()."""
    n, word = inp.numel(), inp.element_size()
    stride = common.round_up(n)
    slots = common.scratch(ctx, 2 * ctx.world_size * stride * word, inp.dtype)
    st = common.state(ctx)
    block, grid, warps = launch_size(ctx, n, word, block, programs, warps)
    trace_buf, trace = kernel_args(ctx)
    options = {"num_warps": warps} if ctx.backend == "cuda" else {}
    plan.launch(
        _gluon_kernel, (grid,), out, inp, slots, st.flags, st.sync, ctx.ctrl, ctx.heap_bases,
        trace_buf, ctx.rank, n, stride, slots.numel() // 2,
        fingerprint(_gluon_kernel, n, word), WORLD=ctx.world_size,
        VEC=max(16 // word, 1), BLOCK=block, WARPS=warps, TRACE=trace, **options)

