"""The "epilogue" schedule, for small M: the communication happens in the GEMM's own
programs, one launch, no second kernel, no producer/consumer hand-off.

matmul_all_reduce / matmul_reduce_scatter (`_push_reduce_kernel`). Program p owns the same
tiles of out on every rank (units p, p + grid, ...; tiles of all M rows, from M and N,
which the ranks share). For each, it computes this rank's partial [BM, BN] tile once (the
weights are read once) and stores it, in the input dtype, into slot `rank` of the heap
scratch of every rank that needs it -- all of them for all_reduce, including itself
(one-shot); each owner its rows of the tile for reduce_scatter -- then tells the peers' program p (release) and waits for theirs (acquire): one DATA
exchange, the collectives' (ccl/device.py: call fingerprint compared, bounded, failure
recorded). Then it sums the world's copies of its tiles from its own scratch, in rank
order, adds the bias and stores out: every rank adds the same values in the same order,
so all_reduce results are bitwise the same on every rank. The scratch is the collectives'
(two halves by launch parity, the same epoch sequence), so nothing is reset between calls
and a CUDA graph replays it. The tile config follows M and N (shared), the GEMM core's
table read at the largest K (ranks' K may differ), split-K off (a tile's pusher is fixed),
the column extent halved while there are fewer tiles than SMs (down to 32).

all_gather_matmul (`_pull_gemm_kernel`). a must be on the heap for peers to read: a
contiguous a on the heap is used where it is (its offset published to the peers, as the
pull collectives do), any other is copied into a heap staging buffer by a step of the
plan (ccl.common.stage). Program p tells the peers' program p that this rank's rows are
in place (ARRIVE) and waits for theirs; then every unit (tile, K slice) runs the k-loop
(_common.dot_ptrs) on rows of A read straight from the heap of the rank that holds them,
and at the end a DONE exchange says it no longer reads the peers' rows (the next call may
overwrite them). The grid is the same on every rank (agreed SMs; each rank's N is its
own); tiles and K slices follow this rank's N and K; split-K slices are summed by the
last one to arrive (_common.finish_slice), in order.

A wait that fails (peer missing, timed out, or in another call: CallMismatch) poisons the
tiles the program owns (NaN) and the kernel touches no peer memory afterwards.

When it should win: at M <= 64 the GEMM streams the weights from HBM and the product is
small, so a launch and a synchronisation saved (vs. "sequential": GEMM, then the
collective) could be worth more than the overlap "fused" buys. all_gather_matmul pays in
link traffic: every column tile reads the remote rows again (A_remote * column tiles).
Measured (docs/fused-ops.md, "Why epilogue misses"; figures: docs/history.md, "Notes moved out of the source"): about
equal to "sequential" at M <= 16 row-parallel (one exchange costs what the separate
collective does), slower at M = 64 (in its k-loop: no split-K, a tile's pusher is fixed;
not yet traced) and for all_gather_matmul (the pull above).
So auto takes it only where a table measured it fastest.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import language as tdl
from ..ccl import common as ccl_common
from ..ccl.device import (ARRIVE, DATA, DONE, begin_epoch, exchange, fingerprint, poison,
                          publish_offset, scratch_half)
from ..runtime.errors import OP_CODES
from ..trace import device as trd
from ..trace import kernel_args, tags
from ._common import add_bias, dot_ptrs, finish_slice, num_sms, store_tile, workspace
from .fused_tile import fused_gemm_config, owned, tile_shape, unit_partial
from .gemm import addresses_only, host_descriptors, operand, tma_compatible
from .schedules import register

MIN_COLUMNS = 32           # the narrowest column tile the row-parallel config shrinks to
STAGE_KEY = "ops.epilogue.a"


@triton.jit
def _push_reduce_kernel(
        a, w, bias, out, scratch, flags, sync, ctrl, heap_bases, trace_buf,
        rank, world_size, M, N, K, m_local, owner_rows, stride_am, stride_wn, stride_om,
        half, slot, num_units, fp,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
        TMA: tl.constexpr, SWAP_AB: tl.constexpr, HAS_BIAS: tl.constexpr,
        OP: tl.constexpr, TRACE: tl.constexpr):
    """Units u = (row block, column block) of out's M x N, the same on every rank. Scratch
    slot s ([m_local, N] row-major; m_local = M for all_reduce) holds rank s's partial of
    this rank's rows, which start at row rank * owner_rows (0 for all_reduce). One GEMM
    tile per unit (the weights are read once): all of it to every rank (all_reduce), or
    each owner's rows of it to that owner (reduce_scatter)."""
    pid = tl.program_id(0)
    epoch = begin_epoch(sync)
    slots = scratch_half(scratch, epoch, half)
    a = operand(a, M, K, stride_am, BM, BK, TMA)    # host-made descriptors pass as they are
    w = operand(w, N, K, stride_wn, BN, BK, TMA)
    num_nb = tl.cdiv(N, BN)
    rows = tl.arange(0, BM)[:, None]
    cols = tl.arange(0, BN)[None, :]
    for u in range(pid, num_units, tl.num_programs(0)):
        m0, n0, acc = unit_partial(u, num_nb, a, stride_am, w, stride_wn, M, N, K, trace_buf,
                                   rank, BM, BN, BK, EVEN_K, TMA, SWAP_AB, TRACE)
        t0 = trd.begin(TRACE)
        part = acc.to(slots.dtype.element_ty)
        for j in range(world_size):             # this rank's own slot last
            dst = (rank + 1 + j) % world_size
            mine, offs = owned(m0, n0, rows, cols, dst * owner_rows, m_local, N)
            tdl.store(slots + offs + rank * slot, part, rank, dst, heap_bases, mask=mine)
        trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    ok = exchange(flags, DATA, epoch, ctrl, rank, world_size, heap_bases, OP, fp,
                  trace_buf, TRACE)
    lo = rank * owner_rows
    for u in range(pid, num_units, tl.num_programs(0)):
        t0 = trd.begin(TRACE)
        m0 = (u // num_nb) * BM
        n0 = (u % num_nb) * BN
        mine, offs = owned(m0, n0, rows, cols, lo, m_local, N)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for s in range(world_size):             # rank order: the same sum everywhere
            acc += tl.load(slots + s * slot + offs, mask=mine, other=0.0).to(tl.float32)
        acc = poison(add_bias(acc, bias, n0, N, BN, HAS_BIAS), ok)
        dst = out + (m0 + rows - lo).to(tl.int64) * stride_om + n0 + cols
        tl.store(dst, acc.to(out.dtype.element_ty), mask=mine)
        trd.end(trace_buf, t0, tags.REDUCE, rank, TRACE)


class RowParallel(NamedTuple):
    """What a row-parallel epilogue kernel launches with (row_parallel)."""
    operands: tuple        # a, w (host TMA descriptors where `descriptors`), bias, out
    trace_buf: torch.Tensor
    grid: int
    num_units: int
    meta: dict             # constexprs: BM, BN, BK, EVEN_K, TMA, SWAP_AB, HAS_BIAS, OP, TRACE
    descriptors: tuple | None    # pass the launch to addresses_only with them


def row_parallel(ctx, op, a, w, bias, config=None) -> RowParallel:
    """The launch of a row-parallel epilogue kernel (the flags', the Lamport exchange's,
    matmul_all_reduce_add_rmsnorm's): tiles of out from M and N alone (the ranks share
    them), units, grid, operands (out as Live(3)) and constexprs."""
    M, K = a.shape
    N = w.shape[0]
    cfg = fused_gemm_config(ctx, M, N, K, None, config, group_m=1, local="K")
    bm, bn = tile_shape(cfg)
    sms = _sms(ctx)
    if not config:              # enough tiles to fill the GPU, from shared sizes only
        while triton.cdiv(M, bm) * triton.cdiv(N, bn) < sms and bn > MIN_COLUMNS:
            bn //= 2
    num_units = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    tma = cfg["PERSISTENT"] and K > 0 and tma_compatible(a, w)
    a_op, w_op = host_descriptors(a, w, bm, bn, cfg["BK"]) if tma else (a, w)
    trace_buf, trace = kernel_args(ctx)
    meta = dict(BM=bm, BN=bn, BK=cfg["BK"], EVEN_K=K % cfg["BK"] == 0, TMA=tma,
                SWAP_AB=cfg["SWAP_AB"], HAS_BIAS=bias is not None, OP=OP_CODES[op],
                TRACE=trace, **_launch_options(ctx, cfg))
    return RowParallel((a_op, w_op, bias if bias is not None else a, _live_out()), trace_buf,
                       max(1, min(num_units, sms)), num_units, meta,
                       (a_op, w_op) if tma else None)


def _row_parallel(ctx, plan, op, a, w, bias, out, config=None, exchange="flags") -> None:
    M, K = a.shape
    N = w.shape[0]
    world = ctx.world_size
    all_reduce = op == "matmul_all_reduce"
    m_local = M if all_reduce else M // world
    rp = row_parallel(ctx, op, a, w, bias, config)
    grid, meta = rp.grid, rp.meta
    if exchange == "lamport":
        from . import epilogue_lamport
        epilogue_lamport.launch(ctx, plan, op, a, w, out, rp.operands, rp.trace_buf, grid,
                                rp.num_units, meta)
    else:
        slot = ccl_common.round_up(m_local * N)
        scratch = ccl_common.scratch(ctx, 2 * world * slot * a.element_size(), a.dtype)
        st = ccl_common.state(ctx)
        fp = fingerprint(_push_reduce_kernel, op, M, N, str(a.dtype), grid, meta["BM"],
                         meta["BN"])
        plan.launch(
            _push_reduce_kernel, (grid,), *rp.operands, scratch, st.flags, st.sync, ctx.ctrl,
            ctx.heap_bases, rp.trace_buf, ctx.rank, world, M, N, K, m_local,
            0 if all_reduce else m_local, a.stride(0), w.stride(0), out.stride(0),
            scratch.numel() // 2, slot, rp.num_units, fp, **meta)
    if rp.descriptors:
        addresses_only(plan.steps[-1], rp.descriptors)


@triton.jit
def _pull_gemm_kernel(
        a, w, bias, out, offsets, my_offset, flags, sync, ctrl, heap_bases, trace_buf,
        k_partials, k_counters, split_k,
        rank, world_size, m_local, M, N, K, stride_wn, stride_om, num_tiles, fp,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
        HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, OP: tl.constexpr,
        TRACE: tl.constexpr):
    """Units u = (tile u // split_k, K slice u % split_k) of out [M, N]; a: this rank's
    rows [m_local, K] (contiguous) on the heap, found on rank s at my_offset's place there
    (offsets[s], published before ARRIVE)."""
    pid = tl.program_id(0)
    epoch = begin_epoch(sync)
    publish_offset(offsets, my_offset, rank, world_size, heap_bases)
    ok = exchange(flags, ARRIVE, epoch, ctrl, rank, world_size, heap_bases, OP, fp,
                  trace_buf, TRACE)
    num_nb = tl.cdiv(N, BN)
    steps = tl.cdiv(K, BK)
    elem = a.dtype.element_ty.primitive_bitwidth // 8
    offs_k = tl.arange(0, BK)
    for u in range(pid, num_tiles * split_k, tl.num_programs(0)):
        t = u // split_k
        s = u % split_k
        m0 = (t // num_nb) * BM
        n0 = (t % num_nb) * BN
        t0 = trd.begin(TRACE)
        rows = (m0 + tl.arange(0, BM)) % M
        src = rows // m_local
        # where rank src keeps its rows, in elements from this rank's a (0 for this rank)
        there = tl.load(offsets + src, volatile=True) - my_offset
        there = tl.where(src == rank, 0, there) // elem
        bases = (tl.load(heap_bases + src) - tl.load(heap_bases + rank)) // elem
        a_rows = a + (bases + there + (rows - src * m_local).to(tl.int64) * K)
        a_ptrs = a_rows[:, None] + offs_k[None, :]
        cols = (n0 + tl.arange(0, BN)) % N
        w_ptrs = w + cols[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
        lo = s * steps // split_k
        hi = (s + 1) * steps // split_k
        hi = tl.where(ok, hi, lo)   # a peer missing or in another call: no peer reads
        acc = dot_ptrs(a_ptrs, w_ptrs, K, lo, hi, BM, BN, BK, EVEN_K)
        if SPLIT:
            last, acc = finish_slice(acc, k_partials, k_counters, t, s, split_k, BM, BN)
        else:
            last = True
        if last:
            acc = add_bias(acc, bias, n0, N, BN, HAS_BIAS)
            store_tile(out, stride_om, poison(acc, ok), m0, n0, tl.minimum(m0 + BM, M), N,
                       BM, BN)
        trd.end(trace_buf, t0, tags.GEMM_TILE, rank, TRACE)
    exchange(flags, DONE, epoch, ctrl, rank, world_size, heap_bases, OP, 0, trace_buf, TRACE)


def _all_gather(ctx, plan, op, a, w, bias, out, config=None, split_k=None) -> None:
    m_local, K = a.shape
    N = w.shape[0]
    M = m_local * ctx.world_size
    cfg = dict(_gather_config(ctx, M), **(config or {}))
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    grid = _sms(ctx)                     # the same on every rank: each rank's N is its own
    num_tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    steps = triton.cdiv(K, bk)
    if split_k is None:
        split = max(1, min(grid // num_tiles, steps // 4))
    elif isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 1:
        raise ValueError(f"{op}: split_k must be a positive int, got {split_k!r}")
    else:
        split = split_k
    flat = a.reshape(-1)                # a copy (at build only) if a is not contiguous
    staged = ccl_common.stage(ctx, plan, flat if a.is_contiguous() else flat.clone(), 0,
                              STAGE_KEY)
    st = ccl_common.state(ctx)
    ws = _split_workspace(ctx)
    if split > 1:
        k_partials, k_counters = ws.split_buffers(op, num_tiles * split * bm * bn, num_tiles)
    else:                       # not read (SPLIT off): the workspace's own words
        k_partials, k_counters = ws.data[:4].view(torch.float32), ws.sync
    trace_buf, trace = kernel_args(ctx)
    fp = fingerprint(_pull_gemm_kernel, M, K, str(a.dtype), grid)
    plan.launch(
        _pull_gemm_kernel, (grid,),
        staged, w, bias if bias is not None else a, _live_out(), st.offsets,
        ctx.heap_offset(staged), st.flags, st.sync, ctx.ctrl, ctx.heap_bases, trace_buf,
        k_partials, k_counters, split, ctx.rank, ctx.world_size, m_local, M, N, K,
        w.stride(0), out.stride(0), num_tiles, fp,
        BM=bm, BN=bn, BK=bk, EVEN_K=K % bk == 0, HAS_BIAS=bias is not None,
        SPLIT=split > 1, OP=OP_CODES[op], TRACE=trace, **_launch_options(ctx, cfg))


def _gather_config(ctx, M: int) -> dict:
    """all_gather_matmul's tile: rows of M (16-64), 128 columns, 64 of K on GPUs."""
    if ctx.backend != "cuda":
        return dict(BM=16, BN=32, BK=32, num_warps=4, num_stages=1)
    bm = min(64, max(16, triton.next_power_of_2(M)))
    return dict(BM=bm, BN=128, BK=64, num_warps=4, num_stages=3)


def _split_workspace(ctx):
    """The workspace that holds this rank's split-K buffers (Workspace.split_buffers: not
    on the heap, made per size). Made by every call, whatever its split (a heap object:
    every rank must make it, and the split is each rank's own)."""
    return workspace(ctx, "epilogue", 256, 64)


def _sms(ctx) -> int:
    """Programs of a launch: the SMs every rank may fill (ccl Agreed), at most the
    collectives' MAX_PROGRAMS (their flags have room for that many per rank)."""
    if ctx.backend != "cuda":
        return num_sms(ctx)
    return max(1, min(256, ccl_common.agreed(ctx).sms or num_sms(ctx)))


def _launch_options(ctx, cfg) -> dict:
    if ctx.backend != "cuda":
        return {}
    return dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def _live_out():
    from ..runtime.plans import Live
    return Live(3)


EXCHANGES = ("flags", "lamport")


def build(ctx, plan, op, a, w, bias, out, config=None, split_k=None, exchange="flags") -> None:
    """Add the epilogue schedule's one launch for `op` to `plan` (module docstring).
    config: tile overrides (BM, BN, BK, num_warps, num_stages; the row-parallel ops also
    SWAP_AB); split_k: all_gather_matmul's K slices per tile (default: enough units to
    fill the grid); exchange: how the row-parallel ops' tiles meet, "flags" (above) or
    "lamport" (epilogue_lamport.py: the data is its own ready flag; small M)."""
    ccl_common.agreed(ctx)
    if exchange not in EXCHANGES:
        raise ValueError(f"{op}: exchange must be one of {EXCHANGES}, got {exchange!r}")
    if op == "all_gather_matmul":
        if exchange != "flags":
            raise ValueError(f"{op}: exchange {exchange!r} is for the row-parallel ops "
                             f"(matmul_all_reduce, matmul_reduce_scatter)")
        _all_gather(ctx, plan, op, a, w, bias, out, config, split_k)
    else:
        if split_k not in (None, 1):
            raise ValueError(f"{op}: the epilogue schedule does not split K (each tile's "
                             f"pusher is fixed); got split_k={split_k!r}")
        _row_parallel(ctx, plan, op, a, w, bias, out, config, exchange)


register("epilogue", build, options=("config", "split_k", "exchange"),
         about="small M: tiles pushed/pulled by the GEMM programs, reduced where they meet")
