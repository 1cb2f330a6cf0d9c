"""Pull reduce-scatter: every rank reads its block from every rank's input over NVLink
and reduces it in fp32 (integers: in their own type), in rank order.

No scratch and no extra copy, so it wins for large blocks; the ARRIVE and DONE
handshakes cost a round trip, so push wins for small blocks (see selector.py). The
input must be on the heap (a plain tensor is staged); the output can be any tensor.

Bandwidth (the figures before this rework: docs/history.md, "Notes moved out of the source"):
- 16-byte remote loads again. Since peers' copies may lie at other heap offsets, the
  loads went through a run-time shift and were scalar. Now every program checks after
  the ARRIVE wait whether all shifts are whole 16-byte vectors (device.py: "Vector
  accesses") and runs `_blocks` with VEC=True (ld.global.v4) if so, VEC=False (scalar,
  any shift) if not.
- All ranks' loads of a block in flight at once. The world size is a constexpr (WORLD),
  so the loop over ranks unrolls and `reduce_peers` issues the WORLD loads before it
  combines them: every link carries traffic at every moment, and a block costs one
  NVLink round trip rather than WORLD of them one after another (the old runtime loop
  also sent every rank to rank 0 first, then all to rank 1, ...).
- Peer pointers translated and shifts read once per program, not per block per rank
  (each was a dependent scalar load in front of the remote loads).
- Above 4 ranks the block shrinks (`reduce_block`: 8 KiB at 8 ranks) so that a program
  holds the same 64 KiB of loads as at 4 ranks: 8 x 16 KiB spilled registers.
To measure: busbw at 8-512 MiB, 4 and 8 GPUs, against the figures above and NCCL; at 8
ranks also block=8192 bf16 elements (16 KiB, spills) against the default 8 KiB.
"""
import triton
import triton.language as tl

from trident.trace import tags

from .. import common
from ..device import (DONE, OP_REDUCE_SCATTER, arrive, depart, peer_ptrs, peer_shifts, poison_out,
                      reduce_peers)


@triton.jit
def _blocks(out, inp, shifts, heap_bases, rank, n, WORLD: tl.constexpr, OP: tl.constexpr,
            WORD: tl.constexpr, BLOCK: tl.constexpr, VEC: tl.constexpr):
    """This program's blocks of my output: block `offs` of segment `rank` of every input."""
    ptrs, oks = peer_ptrs(inp + rank * n, shifts, rank, heap_bases, WORLD, WORD, VEC)
    for blk in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        acc = reduce_peers(ptrs, oks, offs, mask, WORLD, OP, VEC)
        tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _pull_kernel(out, inp, offsets, my_offset, flags, sync, ctrl, heap_bases, trace_buf, rank,
                 n, fp, WORLD: tl.constexpr, OP: tl.constexpr, WORD: tl.constexpr,
                 BLOCK: tl.constexpr, TRACE: tl.constexpr):
    epoch, ok, t0 = arrive(offsets, my_offset, flags, sync, ctrl, heap_bases, trace_buf, rank,
                           WORLD, OP_REDUCE_SCATTER, fp, TRACE)
    shifts, aligned = peer_shifts(offsets, rank, my_offset, WORLD, WORD)
    if not ok:            # a peer is missing or made another call: touch no peer memory
        poison_out(out, n, BLOCK)
    elif aligned:
        _blocks(out, inp, shifts, heap_bases, rank, n, WORLD, OP, WORD, BLOCK, True)
    else:
        _blocks(out, inp, shifts, heap_bases, rank, n, WORLD, OP, WORD, BLOCK, False)
    depart(flags, DONE, epoch, ctrl, rank, WORLD, heap_bases, OP_REDUCE_SCATTER, trace_buf, t0,
           tags.REDUCE, TRACE)


# Bytes of all ranks' loads of one block that a program holds at once on GPUs
# (device.reduce_peers issues them together): 4 ranks x 16 KiB take about 190 registers
# per thread at 8 warps; 8 x 16 KiB spilled (255 registers and 44-316 bytes of spills).
GPU_IN_FLIGHT_BYTES = 4 * common.GPU_BLOCK_BYTES


def reduce_block(ctx, elem_size: int, block):
    """The block (elements) of a pull reduction: common.py's, or smaller above 4 ranks so
    that WORLD blocks stay within GPU_IN_FLIGHT_BYTES (a power of two: at 5-7 ranks, which
    ranks sharing GPUs make possible, the plain quotient is not one)."""
    if block is None and ctx.backend == "cuda":
        block = min(common.GPU_BLOCK_BYTES,
                    GPU_IN_FLIGHT_BYTES // ctx.world_size) // elem_size
        block = 1 << (block.bit_length() - 1)
    return block


def pull(ctx, plan, out, inp, op_code: int, block=None, programs=None, warps=None):
    """out [n], inp [world * n] (checked by the caller). warps: a knob (common.py)."""
    n = out.numel()
    src = common.stage(ctx, plan, inp, 1, "stage.in")
    block = reduce_block(ctx, inp.element_size(), block)
    block, grid = common.launch_size(ctx, n, inp.element_size(), block, programs)
    common.launch_on_heap(ctx, plan, _pull_kernel, (out,), src, (n,),
                          (n, str(inp.dtype), op_code), block, grid, warps, OP=op_code)
