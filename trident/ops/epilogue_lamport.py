"""The epilogue schedule's row-parallel kernel with the Lamport exchange
(`schedule="epilogue", exchange="lamport"`): matmul_all_reduce / matmul_reduce_scatter at
decode sizes, one launch, no fence, no flag round.

Program p owns the same tiles of out on every rank (epilogue.py). It sends its head (the
Lamport round and the call's fingerprint) to every peer first, then for each of its tiles:
computes this rank's partial [BM, BN] tile once, stores it as words (ccl/lamport.py
`to_words`) into slot `rank` of the current Lamport buffer of every rank that needs it (all
of them for all_reduce; each owner its rows of the tile for reduce_scatter), and receives
the peers' partials of its own rows of that tile (`lamport.receive`: polled until no word
is the sentinel, summed in rank order with its own partial in registers, cleared), adds the
bias and stores out. A tile's exchange starts as soon as the tile is computed, and nothing
waits on a peer's other tiles. The round counter is the one every Lamport kernel of the
context shares, so a peer in another call (a collective, another size) is caught by its
head; a wait that fails poisons the program's tiles (NaN).

Slot layout: the partial rows a rank sends to an owner, [m_local, N] row-major from the
owner's first row. So a call fits where m_local * N elements fit a Lamport slot
(`fits`); bf16/fp16/fp32. When it should win: where "epilogue" with flags costs what the
separate collective does (row-parallel, M <= 16 on 2x H100: docs/fused-ops.md), since it
drops the release fence per peer and the flag trip; not yet measured on GPUs, so "auto"
does not pick it.

NORM: the same kernel as ctx.matmul_all_reduce_add_rmsnorm's one kernel (schedule
"fused": matmul_all_reduce_add_rmsnorm.py) -- the whole communication of a decode TP layer
in one launch. A tile's sum, bias added, is not stored: res_out = residual + it (rounded
once, poisoned where a wait failed; res_out is a new tensor, or residual itself for the
in-place add), then the program counts itself in its row
block's arrival counter (acq_rel, gpu scope). The norm needs whole rows while a tile holds
BN columns: the program that arrives last -- every column tile of those rows is stored by
then -- normalises the block's rows (`_norm_rows`: a row at a time, squares summed in
column order from the stored res_out, as add_rmsnorm.py's kernels) into out, and rearms
the counter to 0. No program waits for another program of the launch (no deadlock on any
grid; the CPU emulation runs programs one after another), and every counter is 0 after a
launch: nothing is reset between calls and a CUDA graph replays it. Per call: one launch
of min(tiles, SMs) programs; per program one head per peer and one poll per tile (no
fence, no flag); per tile one arrival atomic; per row block one rearm. Rounding as
all_reduce_add_rmsnorm's (the partials rounded to the input dtype as matmul_all_reduce
sends them, summed in fp32 in rank order; the residual rounded once; the norm in fp32
from it; out rounded once), so res_out and out are bitwise the same on every rank.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import language as tdl
from ..ccl import common as ccl_common, lamport
from ..ccl.add_rmsnorm import _add_residual, _norm_row
from ..ccl.device import fingerprint, poison
from ..trace import device as trd
from ..trace import tags
from ._common import add_bias
from .fused_tile import owned, unit_partial
from .gemm import operand

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
GPU_NORM_BLOCK, CPU_NORM_BLOCK = 2048, 256      # elements of a row per step of the norm


@triton.jit
def _norm_rows(residual, weight, out, m0, M, N, eps, BM: tl.constexpr, BLOCK: tl.constexpr):
    """out = rmsnorm(residual) * weight on rows m0 .. m0 + BM below M (contiguous [M, N]),
    a row at a time, from the residual the row block's tile programs stored."""
    for row in range(m0, tl.minimum(m0 + BM, M)):
        start = row * N             # int32: M * N fits a Lamport slot
        squares = tl.zeros([BLOCK], dtype=tl.float32)
        for c in range(0, N, BLOCK):
            cols = c + tl.arange(0, BLOCK)
            r = tl.load(residual + start + cols, mask=cols < N, other=0.0).to(tl.float32)
            squares += r * r
        _norm_row(residual, weight, out, start, N, squares, eps, BLOCK)


@triton.jit
def _add_and_norm(total, residual, res_out, weight, out, counters, offs, mask, block, m0, M,
                  N, num_nb, eps, BM: tl.constexpr, BLOCK: tl.constexpr):
    """NORM's end of a tile (module docstring): res_out = residual + total (res_out may be
    residual); the row block's arrival; its last tile normalises the block's rows (from
    res_out) and rearms the counter."""
    _add_residual(residual, offs, mask, total, res_out)
    # every thread's residual stores before the arrival (release); the last to arrive
    # reads the other tiles' after it (acquire), as _common.finish_slice
    tl.debug_barrier()
    arrived = tl.atomic_add(counters + block, 1, sem="acq_rel", scope="gpu")
    if arrived == num_nb - 1:
        tl.store(counters + block, 0)                     # rearmed for the next launch
        _norm_rows(res_out, weight, out, m0, M, N, eps, BM, BLOCK)


@triton.jit
def _push_reduce_lamport_kernel(
        a, w, bias, out, residual, res_out, norm_weight, counters, data, heads, lsync, fsync,
        ctrl,
        heap_bases, trace_buf, rank, M, N, K, m_local, owner_rows, stride_am, stride_wn,
        stride_om, slot, num_units, eps, fp,
        WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
        EVEN_K: tl.constexpr, TMA: tl.constexpr, SWAP_AB: tl.constexpr,
        HAS_BIAS: tl.constexpr, NORM: tl.constexpr, NORM_BLOCK: tl.constexpr,
        OP: tl.constexpr, TRACE: tl.constexpr, PDL: tl.constexpr):
    """Units u = (row block, column block) of out's M x N, the same on every rank; slot s of
    this round's buffer holds rank s's partial of this rank's rows (from row
    rank * owner_rows; owner_rows = 0 for all_reduce, m_local = M). NORM (all_reduce
    only): residual, res_out and out contiguous [M, N], counters[row block] the tiles of it
    stored; else residual, res_out, norm_weight, counters and eps are not read."""
    pid = tl.program_id(0)
    epoch, buf, base, expect = lamport.open_round(data, lsync, slot, fp, WORLD, PDL)
    lamport.send_heads(heads, buf, expect, rank, heap_bases, WORLD)
    heads_row = heads + buf * WORLD * lamport.MAX_PROGRAMS + pid
    a = operand(a, M, K, stride_am, BM, BK, TMA)
    w = operand(w, N, K, stride_wn, BN, BK, TMA)
    num_nb = tl.cdiv(N, BN)
    rows = tl.arange(0, BM)[:, None]
    cols = tl.arange(0, BN)[None, :]
    lo = rank * owner_rows
    ok = tl.cast(1, tl.int1)
    for u in range(pid, num_units, tl.num_programs(0)):
        m0, n0, acc = unit_partial(u, num_nb, a, stride_am, w, stride_wn, M, N, K, trace_buf,
                                   rank, BM, BN, BK, EVEN_K, TMA, SWAP_AB, TRACE)
        t0 = trd.begin(TRACE)
        part = acc.to(out.dtype.element_ty)
        words = lamport.to_words(part)
        for i in tl.static_range(1, WORLD):
            dst = (rank + i) % WORLD
            theirs, offs = owned(m0, n0, rows, cols, dst * owner_rows, m_local, N)
            tdl.store(base + rank * slot + offs, words, rank, dst, heap_bases, mask=theirs)
        trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
        t0 = trd.begin(TRACE)
        mine, offs = owned(m0, n0, rows, cols, lo, m_local, N)
        total, ok = lamport.receive(base, slot, heads_row, lamport.canonical(part), offs,
                                    mine, expect, ok, ctrl, fsync, rank, heap_bases, 0,
                                    WORLD, OP)
        total = poison(add_bias(total, bias, n0, N, BN, HAS_BIAS), ok)
        if NORM:
            _add_and_norm(total, residual, res_out, norm_weight, out, counters, offs, mine,
                          u // num_nb, m0, M, N, num_nb, eps, BM, NORM_BLOCK)
        else:
            dst_ptr = out + (m0 + rows - lo).to(tl.int64) * stride_om + n0 + cols
            tl.store(dst_ptr, total.to(out.dtype.element_ty), mask=mine)
        trd.end(trace_buf, t0, tags.REDUCE, rank, TRACE)
    lamport.clear_heads(heads_row, rank, WORLD)
    lamport.end(lsync, epoch)


def fits(ctx, op: str, M: int, N: int, elem: int) -> bool:
    """Whether the partial rows one rank sends an owner fit a Lamport slot."""
    m_local = M // ctx.world_size if op == "matmul_reduce_scatter" else M
    return m_local * N * elem <= lamport.slot_bytes(ctx)


def launch(ctx, plan, op, a, w, out, operands, trace_buf, grid, num_units, meta,
           norm=None) -> None:
    """Add the kernel's launch: `operands` (a, w, bias, out as the kernel takes them), the
    grid, units and constexprs `meta` as epilogue.row_parallel made them; norm: NORM's
    (residual, res_out, norm_weight, counters, eps) (matmul_all_reduce_add_rmsnorm; res_out
    a tensor or Live), else None."""
    M, K = a.shape
    N = w.shape[0]
    if a.dtype not in DTYPES:
        raise TypeError(f"{op}: exchange 'lamport' takes bfloat16, float16 or float32, got "
                        f"{a.dtype}")
    if not fits(ctx, op, M, N, a.element_size()):
        raise ValueError(f"{op}: exchange 'lamport' holds at most {lamport.slot_bytes(ctx)} "
                         f"bytes of partial rows per rank (M x N x element size, M / world for "
                         f"reduce_scatter) with this heap; got M={M}, N={N}: use "
                         f"exchange='flags'")
    m_local = M // ctx.world_size if op == "matmul_reduce_scatter" else M
    ws = lamport.workspace(ctx)
    data, slot = ws.slots(a.dtype)
    # without NORM: the call's a and the round word stand in for what is not read
    residual, res_out, norm_weight, counters, eps = norm or (a, a, a, ws.sync, 0.0)
    block = min(max(16, triton.next_power_of_2(N)),
                GPU_NORM_BLOCK if ctx.backend == "cuda" else CPU_NORM_BLOCK)
    fp = fingerprint(_push_reduce_lamport_kernel, op, M, N, str(a.dtype), grid, meta["BM"],
                     meta["BN"], *((str(norm_weight.dtype), meta["HAS_BIAS"], eps) if norm
                                   else ()))
    plan.launch(
        _push_reduce_lamport_kernel, (grid,), *operands, residual, res_out, norm_weight, counters,
        data, ws.heads, ws.sync, ccl_common.state(ctx).sync, ctx.ctrl, ctx.heap_bases,
        trace_buf, ctx.rank, M, N, K, m_local, m_local if op == "matmul_reduce_scatter" else 0,
        a.stride(0), w.stride(0), out.stride(0), slot, num_units, eps, fp, WORLD=ctx.world_size,
        NORM=norm is not None, NORM_BLOCK=block if norm else 16, **meta,
        **lamport.pdl(ctx))
