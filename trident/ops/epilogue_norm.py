"""The one kernel of ctx.matmul_all_reduce_add_rmsnorm (schedule "fused"): row-parallel
linear -> all-reduce -> residual add -> RMSNorm, the whole communication of a decode TP
layer, in one launch.

Tiles and sums: matmul_all_reduce's epilogue kernel with the Lamport exchange
(epilogue_lamport.py). Program p owns the same tiles of out [M, N] on every rank (units
p, p + grid, ...; the tile from M and N alone, epilogue.row_parallel). For each, it
computes this rank's partial tile once, sends it as words into slot `rank` of the current
Lamport buffer of every peer, and receives the peers' partials of the same tile
(`lamport.receive`: polled until no word is the sentinel, summed in rank order with its
own in fp32, cleared). Then, still in registers: + bias (once), residual += that sum,
rounded once to residual's dtype and stored in place.

The norm needs whole rows; a tile holds BN columns. Each tile program, its residual tile
stored, counts itself in its row block's arrival counter (acq_rel, gpu scope); the one
that arrives last -- every column tile of those rows is stored by then -- normalises the
block's rows, one row at a time (add_rmsnorm.py's `_norm_row`: squares summed in column
order from the stored residual, rsqrt, * weight), and rearms the counter to 0. No program
ever waits for another program of this launch (no deadlock on any grid; the CPU emulation
runs programs one after another), and every counter is 0 after a launch, so nothing is
reset between calls and a CUDA graph replays it as it is.

Per call: one launch of min(tiles, SMs) programs; per program one head store per peer
and one poll per tile (no fence, no flag, no barrier); per tile one arrival atomic; per
row block one rearm. Rounding as all_reduce_add_rmsnorm's: the sum in fp32 (of partials
rounded to the input dtype, as matmul_all_reduce sends them), the residual rounded once,
the norm in fp32 from the rounded residual, out rounded once. Every rank sums and
normalises the same values in the same order: residual and out are bitwise the same
everywhere (given the same residual, TP's replicated stream).

A wait that fails (a peer missing, timed out, or in another call: CallMismatch) poisons
(NaN) the residual of the program's tiles from that tile on, and with them the rows' out.
The Lamport round and buffers are the context's (lamport.workspace), so calls of this op
interleave with every other Lamport kernel. Capacity: M <= MAX_M rows and M * N partial
elements in a Lamport slot (`why_not`).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..ccl import common as ccl_common, lamport
from ..ccl.add_rmsnorm import _add_residual, _norm_row
from ..ccl.device import fingerprint, poison
from ..trace import device as trd
from ..trace import tags
from . import _common
from ._common import add_bias
from .epilogue import row_parallel
from .fused_tile import owned, unit_partial
from .gemm import addresses_only, operand

NAME = "matmul_all_reduce_add_rmsnorm"
MAX_M = 256                 # rows of the one-kernel path (decode); the counters' number
GPU_NORM_BLOCK, CPU_NORM_BLOCK = 2048, 256      # elements of a row per step of the norm


@triton.jit
def _norm_rows(residual, weight, out, m0, M, N, eps, BM: tl.constexpr, BLOCK: tl.constexpr):
    """out = rmsnorm(residual) * weight on rows m0 .. m0 + BM below M, a row at a time,
    from the residual the row block's tile programs stored (ordered before by the
    counter's acquire)."""
    for row in range(m0, tl.minimum(m0 + BM, M)):
        start = row * N             # int32: M * N fits a Lamport slot
        squares = tl.zeros([BLOCK], dtype=tl.float32)
        for c in range(0, N, BLOCK):
            cols = c + tl.arange(0, BLOCK)
            r = tl.load(residual + start + cols, mask=cols < N, other=0.0).to(tl.float32)
            squares += r * r
        _norm_row(residual, weight, out, start, N, squares, eps, BLOCK)


@triton.jit
def _matmul_ar_norm_kernel(
        a, w, bias, out, residual, norm_weight, counters, data, heads, lsync, fsync, ctrl,
        heap_bases, trace_buf, rank, M, N, K, stride_am, stride_wn, slot, num_units, eps, fp,
        WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
        EVEN_K: tl.constexpr, TMA: tl.constexpr, SWAP_AB: tl.constexpr,
        HAS_BIAS: tl.constexpr, OP: tl.constexpr, NORM_BLOCK: tl.constexpr,
        TRACE: tl.constexpr):
    """Units u = (row block u // tiles per row, column block), the same on every rank;
    slot s of this round's buffer holds rank s's partial of out, [M, N] row-major;
    residual and out contiguous [M, N]; counters[row block]: tiles of it stored."""
    pid = tl.program_id(0)
    epoch, buf, base, expect = lamport.open_round(data, lsync, slot, fp, WORLD)
    lamport.send_heads(heads, buf, expect, rank, heap_bases, WORLD)
    heads_row = heads + buf * WORLD * lamport.MAX_PROGRAMS + pid
    a = operand(a, M, K, stride_am, BM, BK, TMA)
    w = operand(w, N, K, stride_wn, BN, BK, TMA)
    num_nb = tl.cdiv(N, BN)
    rows = tl.arange(0, BM)[:, None]
    cols = tl.arange(0, BN)[None, :]
    ok = tl.cast(1, tl.int1)
    for u in range(pid, num_units, tl.num_programs(0)):
        m0, n0, acc = unit_partial(u, num_nb, a, stride_am, w, stride_wn, M, N, K, trace_buf,
                                   rank, BM, BN, BK, EVEN_K, TMA, SWAP_AB, TRACE)
        t0 = trd.begin(TRACE)
        part = acc.to(residual.dtype.element_ty)
        mine, offs = owned(m0, n0, rows, cols, 0, M, N)
        lamport.send(base + rank * slot, lamport.to_words(part), offs, mine, rank, heap_bases,
                     WORLD)
        trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
        t0 = trd.begin(TRACE)
        total, ok = lamport.receive(base, slot, heads_row, lamport.canonical(part), offs,
                                    mine, expect, ok, ctrl, fsync, rank, heap_bases, 0, WORLD,
                                    OP)
        # residual += sum + bias, rounded once; NaN from a failed wait on (poison)
        _add_residual(residual, offs, mine,
                      poison(add_bias(total, bias, n0, N, BN, HAS_BIAS), ok))
        # every thread's residual stores before the arrival (release); the last to arrive
        # reads the other tiles' after it (acquire), as _common.finish_slice
        tl.debug_barrier()
        block = u // num_nb
        arrived = tl.atomic_add(counters + block, 1, sem="acq_rel", scope="gpu")
        if arrived == num_nb - 1:
            tl.store(counters + block, 0)                 # rearmed for the next launch
            _norm_rows(residual, norm_weight, out, m0, M, N, eps, BM, NORM_BLOCK)
        trd.end(trace_buf, t0, tags.REDUCE, rank, TRACE)
    lamport.clear_heads(heads_row, rank, WORLD)
    lamport.end(lsync, epoch)


# ---------------------------------------------------------------------------- host
def why_not(ctx, M: int, N: int, elem: int) -> str | None:
    """Why the one kernel cannot take a call of M x N (elements of `elem` bytes), None where
    it can: the same on every rank (shared sizes, the agreed heap)."""
    if M > MAX_M:
        return f"takes at most {MAX_M} rows (decode sizes), got M={M}"
    cap = lamport.slot_bytes(ctx)
    if M * N * elem > cap:
        return (f"holds at most {cap} bytes of M x N partial sums per rank with this heap "
                f"({ctx.heap_size} bytes), got M={M}, N={N}: {M * N * elem}")
    return None


def _counters(ctx):
    """The row blocks' arrival counters (int32, all 0 between launches; ctx.reset
    zeroes them): one workspace of the context, the same size whatever the call."""
    ws = _common.workspace(ctx, NAME, 256, MAX_M)
    return ws.sync[int(getattr(_common.SYNC_FLAGS, "value", _common.SYNC_FLAGS)):]


def build(ctx, plan, a, w, bias, residual, norm_weight, eps: float, config=None) -> None:
    """Add the kernel's launch to `plan` (tensors: a, w, bias, out, residual, norm_weight;
    out is Live(3)). Inputs are checked and fit (why_not) before."""
    M, K = a.shape
    N = w.shape[0]
    rp = row_parallel(ctx, NAME, a, w, bias, config)
    meta = rp.meta
    ws = lamport.workspace(ctx)
    data, slot = ws.slots(a.dtype)
    gpu = ctx.backend == "cuda"
    block = min(max(16, triton.next_power_of_2(N)), GPU_NORM_BLOCK if gpu else CPU_NORM_BLOCK)
    fp = fingerprint(_matmul_ar_norm_kernel, M, N, str(a.dtype), str(norm_weight.dtype),
                     rp.grid, meta["BM"], meta["BN"], meta["HAS_BIAS"], float(eps))
    plan.launch(
        _matmul_ar_norm_kernel, (rp.grid,), *rp.operands, residual, norm_weight,
        _counters(ctx), data, ws.heads, ws.sync, ccl_common.state(ctx).sync, ctx.ctrl,
        ctx.heap_bases, rp.trace_buf, ctx.rank, M, N, K, a.stride(0), w.stride(0), slot,
        rp.num_units, float(eps), fp, WORLD=ctx.world_size, NORM_BLOCK=block, **meta)
    if rp.descriptors:
        addresses_only(plan.steps[-1], rp.descriptors)
