"""Pull all-gather: every rank reads every peer's block straight from the peer's input.

No scratch and no local copy: each byte crosses NVLink once and lands in the output,
so this wins for large blocks; the ARRIVE handshake before reading and the DONE one
before returning cost a round trip, so push wins for small blocks (see selector.py).
The input must be on the heap (a plain tensor is staged); the output can be any tensor.

Bandwidth (the figures before this rework: docs/history.md, "Notes moved out of the source"):
- 16-byte remote loads again. The loads went through a run-time shift (peers' copies may
  lie at other heap offsets) and were scalar. Now each (program, peer) checks whether the
  peer's shift is whole 16-byte vectors (device.py: "Vector accesses") and copies with
  VEC=True (ld.global.v4) if so, VEC=False (scalar, any shift) if not -- per peer, so one
  odd peer (e.g. an in-place input at an odd offset) does not slow the others.
- Every peer read at once. All programs used to read peer rank+1, then rank+2, ...
  together, so a rank pulled from one peer at a time (the single-peer pull rate, 333
  GB/s). Program p now starts at peer rank+p: at any moment about 1/WORLD of the
  programs read from each peer, every link carries traffic, and each rank's outgoing
  reads are spread over all its peers as well.
- 32 KiB per program step on GPUs (twice common.py's 16 KiB: each thread has eight
  16-byte loads in flight, not four): a pull waits one NVLink round trip per step, so
  the bytes in flight per program set its rate.
- The peer's pointer is translated once per (program, peer), not per block.
To measure: busbw at 2-512 MiB on 4 and 8 GPUs against the figures above and NCCL
(target: >= NCCL from 32 MiB, >= 360 GB/s at 512 MiB), and block=4096 words (16 KiB,
the old step) against the default, to confirm the larger step.

Knobs (keyword options, `python -m bench.lab.sweep` times them): block, programs,
warps, and order: "peer" (the default: a program copies all its blocks of one peer, then
the next peer's) or "block" (per block, the loads of every rank's copy are issued
together, then stored, as reduce_scatter's pull does: WORLD x BLOCK in flight per
program, so the default block halves with it).
"""
import triton
import triton.language as tl

import trident.language as tdl
from trident.trace import tags

from .. import common
from ..device import (DONE, OP_ALL_GATHER, arrive, depart, load_peers, peer_ptrs, peer_shift,
                      peer_shifts, poison_out, shift_ok, vec_aligned, vec_shift)

GPU_BLOCK_BYTES = 2 * common.GPU_BLOCK_BYTES      # see "32 KiB per program step" above


@triton.jit
def _copy(dst, src, n, ok, BLOCK: tl.constexpr, VEC: tl.constexpr):
    """This program's blocks of `src` (a peer's input, already translated) into `dst`."""
    for blk in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        if not VEC:
            mask = mask & ok
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.jit
def _copy_all(out, inp, shifts, heap_bases, rank, n, WORLD: tl.constexpr, WORD: tl.constexpr,
              BLOCK: tl.constexpr, VEC: tl.constexpr):
    """order="block": per block, every rank's copy loaded at once, then stored."""
    ptrs, oks = peer_ptrs(inp, shifts, rank, heap_bases, WORLD, WORD, VEC)
    for blk in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        xs = load_peers(ptrs, oks, offs, mask, WORLD, VEC)
        for src in tl.static_range(WORLD):
            if VEC:
                tl.store(out + src * n + offs, xs[src], mask=mask)
            else:
                tl.store(out + src * n + offs, xs[src], mask=mask & oks[src])


@triton.jit
def _pull_block_kernel(out, inp, offsets, my_offset, flags, sync, ctrl, heap_bases, trace_buf,
                       rank, n, fp, WORLD: tl.constexpr, WORD: tl.constexpr, BLOCK: tl.constexpr,
                       TRACE: tl.constexpr):
    """order="block" (see the module docstring); the handshakes as in _pull_kernel."""
    epoch, ok, t0 = arrive(offsets, my_offset, flags, sync, ctrl, heap_bases, trace_buf, rank,
                           WORLD, OP_ALL_GATHER, fp, TRACE)
    shifts, aligned = peer_shifts(offsets, rank, my_offset, WORLD, WORD)
    if not ok:            # a peer is missing or made another call: touch no peer memory
        poison_out(out, WORLD * n, BLOCK)
    elif aligned:
        _copy_all(out, inp, shifts, heap_bases, rank, n, WORLD, WORD, BLOCK, True)
    else:
        _copy_all(out, inp, shifts, heap_bases, rank, n, WORLD, WORD, BLOCK, False)
    depart(flags, DONE, epoch, ctrl, rank, WORLD, heap_bases, OP_ALL_GATHER, trace_buf, t0,
           tags.FETCH, TRACE)


@triton.jit
def _pull_kernel(out, inp, offsets, my_offset, flags, sync, ctrl, heap_bases, trace_buf, rank,
                 n, fp, WORLD: tl.constexpr, WORD: tl.constexpr, BLOCK: tl.constexpr,
                 TRACE: tl.constexpr):
    pid = tl.program_id(0)
    epoch, ok, t0 = arrive(offsets, my_offset, flags, sync, ctrl, heap_bases, trace_buf, rank,
                           WORLD, OP_ALL_GATHER, fp, TRACE)
    if not ok:            # a peer is missing or made another call: touch no peer memory
        poison_out(out, WORLD * n, BLOCK)
    else:
        for i in range(WORLD):
            src = (rank + pid + i) % WORLD
            shift = peer_shift(offsets, src, rank, my_offset, WORD)
            if vec_aligned(shift, WORD):
                _copy(out + src * n, tdl.translate(inp + vec_shift(shift, WORD), rank, src,
                                                   heap_bases), n, True, BLOCK, True)
            else:
                _copy(out + src * n, tdl.translate(inp + shift, rank, src, heap_bases), n,
                      shift_ok(shift), BLOCK, False)
    depart(flags, DONE, epoch, ctrl, rank, WORLD, heap_bases, OP_ALL_GATHER, trace_buf, t0,
           tags.FETCH, TRACE)


ORDERS = ("peer", "block")


def check_knobs(order="peer") -> None:
    """The order knob's check (also made where no kernel runs: one rank, empty input)."""
    if order not in ORDERS:
        raise ValueError(f"all_gather pull: order must be one of {ORDERS}, got {order!r}")


def check_options(ctx, word: int, block, warps=None, order="peer") -> None:
    """The knobs' values, for ccl/registry.py (before anything is launched)."""
    check_knobs(order)


def pull(ctx, plan, out, inp, block=None, programs=None, warps=None, order="peer"):
    """out, inp: flat word views (checked by the caller); out has world * inp.numel().
    warps, order: knobs (module docstring)."""
    check_knobs(order)
    n = inp.numel()
    src = common.stage(ctx, plan, inp, 1, "stage.in")
    if block is None and ctx.backend == "cuda":
        block = GPU_BLOCK_BYTES // inp.element_size() // (2 if order == "block" else 1)
    block, grid = common.launch_size(ctx, n, inp.element_size(), block, programs)
    kernel = _pull_kernel if order == "peer" else _pull_block_kernel
    common.launch_on_heap(ctx, plan, kernel, (out,), src, (n,), (n, src.element_size()),
                          block, grid, warps)
