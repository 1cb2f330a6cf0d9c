"""Lamport reduce-scatter: rank r stores block p of its input into its slot of rank p's
receive buffer (p != r), and each rank reduces its own block over ranks, in rank order,
as the peers' words arrive (ccl/lamport.py: the data is its own ready flag); its own
contribution comes from its input.

It moves what push moves, (world-1)*n per rank for an output of n, in one kernel and
one NVLink trip, without push's release fence and flag round, so it is the latency path
for small blocks (an output of at most `ccl.lamport.capacity` bytes per rank: 1 MiB with
the default heap); pull wins once bandwidth matters. Floating dtypes only (bf16, fp16,
fp32: the sentinel is a float bit pattern); fp32 accumulation in rank order, so the
result is bit-identical to what any rank would compute. A -0.0 of bf16/fp16 travels as
+0.0 (and the fp32 denormal -4.59e-41 as +0.0); the rank's own block is taken the same
way (lamport.canonical). A failed wait poisons the block (NaN).
"""
import triton
import triton.language as tl

import trident.language as tdl
from trident.trace import device as trd, tags

from .. import lamport as proto
from ..device import OP_REDUCE_SCATTER


@triton.jit
def _lamport_kernel(out, inp, data, heads, lsync, fsync, ctrl, heap_bases, trace_buf, rank, n,
                    slot, fp, WORLD: tl.constexpr, OP: tl.constexpr, BLOCK: tl.constexpr,
                    TRACE: tl.constexpr, PDL: tl.constexpr):
    t0 = trd.begin(TRACE)
    epoch, buf, base, expect = proto.open_round(data, lsync, slot, fp, WORLD, PDL)
    pid, programs = tl.program_id(0), tl.num_programs(0)
    for blk in range(pid, tl.cdiv(n, BLOCK), programs):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        for i in tl.static_range(1, WORLD):      # block p of my input into my slot on p
            peer = (rank + i) % WORLD
            words = proto.to_words(tl.load(inp + peer * n + offs, mask=mask))
            tdl.store(base + rank * slot + offs, words, rank, peer, heap_bases, mask=mask)
    heads_row, ok, t0 = proto.sent(heads, buf, expect, rank, heap_bases, trace_buf, t0, WORLD,
                                   TRACE)
    proto.receive_blocks(out, inp + rank * n, base, slot, heads_row, expect, ok, ctrl, fsync,
                         rank, heap_bases, n, OP, WORLD, OP_REDUCE_SCATTER, BLOCK)
    proto.clear_heads(heads_row, rank, WORLD)
    proto.end(lsync, epoch)
    trd.end(trace_buf, t0, tags.REDUCE, rank, TRACE)


def fits(ctx, nbytes: int) -> bool:
    """Whether `nbytes` per rank (the selector's measure) is within what this context's
    Lamport buffers take (registry.py: "auto" passes over it otherwise)."""
    return nbytes <= proto.limit(ctx, "reduce_scatter")


def lamport(ctx, plan, out, inp, op_code: int, block=None, programs=None, warps=None):
    """out [n], inp [world * n] (checked by the caller)."""
    n = out.numel()
    proto.check(ctx, "reduce_scatter", out.dtype, n * out.element_size(), "push",
                "'push' or 'pull'", what="an output of ")
    proto.launch(ctx, plan, _lamport_kernel, (out, inp), out.dtype, n,
                 (n, str(out.dtype), op_code), block, programs, warps, OP=op_code)
