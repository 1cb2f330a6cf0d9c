"""all_gather_matmul: out [M, N_local] = all_gather(a, dim 0) @ w.T + bias (column-parallel).

a: [M/world, K] on each rank, w: [N_local, K] (nn.Linear layout), bias: [N_local].

One launch, two roles. Pusher programs (the low program ids) copy this rank's rows of A
into the gathered buffer of every rank (itself first, 16-byte vector stores over NVLink),
one BM-row block at a time, and after each block set that block's ready flag on every
rank (release, system scope). GEMM programs (the higher ids) each own one output tile;
they wait (acquire) for the flags of the sources whose rows their tile covers, then run
the K loop on the gathered buffer. Tiles are taken in the order their rows arrive: this
rank's first block, then the first block of rank+1, rank+2, ..., then every rank's second
block, and so on -- the GEMM on local rows hides the first transfer, and the GEMM on each
block hides the transfer of the next. Pushing (not pulling) means `a` can be any tensor:
it need not be on the symmetric heap, and nothing is copied before the launch.

The GEMM programs run one of three cores (_common: env TRIDENT_GEMM, or the gemm= option):
- "classic": one output tile per program (a grid of pushers + every tile), pointer loads.
- "tma": persistent GEMM programs, at most one per SM, take the tiles in the same arrival
  order from a queue word (so a program that starts late, after a pusher left its SM,
  just takes fewer tiles); for each tile they wait for its row block's flags, fence the
  async proxy (the rows came through generic stores, TMA reads through the async proxy),
  then load A from the gathered buffer and W through in-kernel TMA descriptors, pipelined
  over K (num_stages). TMA needs K % 8 == 0 (16-byte rows of the gathered buffer) and a
  16-byte aligned w; otherwise the same persistent programs use pointer loads. Tile
  configs come from gemm_table.json by the class of (M total, N_local, K). The epilogue
  (bias, masked store into `out`) is the classic one.
- Either core runs swap-AB and split-K configs (fused_tile.py): the row block is the
  tile's rows of out (a swap-AB config's BN), and with split-K each slice waits for its
  rows, and only the last one, once the slices are summed, adds the bias and stores.
- "gluon" (fused_gluon.py): the same pushers, and persistent GEMM programs that are warp
  specialised in Gluon -- a producer warp that waits for each tile's rows, fences the
  async proxy and issues the TMA loads into a ring of mbarrier slots, consumer warp
  groups that issue the wgmma (gemm_ws.py's kernel) -- from the same queue, in the same
  order. An sm_90 GPU and K % 8 == 0 (else, and on the CPU emulation, the "tma" core;
  a w that TMA cannot address: the "tma" kernel with the same BM, on that rank alone);
  plain and split-K configs, no swap-AB. Not measured yet, so "auto" never takes it.
The pushers, the tiles' order and the rows' wait are one code for both kernels
(gather_rows.py), and a rank on either kernel exchanges the same flags and fingerprint.
To be measured on 2 GPUs (`trident bench ops`, TRIDENT_GEMM=tma against classic): the
fused time per shape, and whether 16 pushers beside one GEMM program per SM is the
right split now that the GEMM programs are persistent.

When it wins: the communication is M*K*2*(world-1)/world bytes into each GPU against a
GEMM of 2*M*N_local*K flops, so fusion pays where the all-gather is a sizeable share of
the plain path (large K, modest N_local). The crossover per shape is measured by
`trident bench ops` and recorded in trident/ops/crossover.json (see selector.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import language as tdl
from ..trace import device as trd
from ..trace import kernel_args, tags
from . import schedules
from ..runtime.compiled import STANDINS, is_compiling
from ..runtime.plans import Live, Plan
from ..ccl.device import fingerprint, poison
from ._common import (SYNC_EPOCH, SYNC_FLAGS, add_bias, check_inputs, check_matrices,
                      finish_program, finish_slice, run, schedule_plan, store_tile, take_tile,
                      workspace)
from .fused_tile import (fused_gemm_config, gemm_programs, num_tiles as count_tiles,
                         op_tile, split_buffers, split_count, tile_shape)
from .gather_rows import arrival_tile, push_rows, wait_rows
from .gemm import addresses_only, operand, tma_compatible


@triton.jit
def _all_gather_matmul_kernel(
        a, w, bias, out, gathered, sync, ctrl, heap_bases, trace_buf,
        k_partials, k_counters, split_k,
        rank, world_size, m_local, M, N, K, stride_am, stride_wn, stride_om, fp,
        NUM_PUSHERS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
        GROUP_M: tl.constexpr, COPY_M: tl.constexpr, COPY_K: tl.constexpr,
        EVEN_K: tl.constexpr, ALIGNED: tl.constexpr, HAS_BIAS: tl.constexpr,
        PERSISTENT: tl.constexpr, TMA: tl.constexpr, SWAP_AB: tl.constexpr,
        SPLIT: tl.constexpr, TRACE: tl.constexpr):
    """BM x BN: the tile of out (fused_tile.tile_shape); BM is also the pushers' row
    block. SPLIT: split_k slices per tile, work unit u = (tile u // split_k, slice
    u % split_k); each slice waits for its rows, and only the last adds the bias and
    stores the summed tile (finish_slice). A wait that failed (or met another call's
    fingerprint) poisons the tiles it guards (NaN)."""
    pid = tl.program_id(0)
    epoch = tdl.launch_epoch(sync + SYNC_EPOCH)
    flags = sync + SYNC_FLAGS
    num_mb = tl.cdiv(M, BM)
    if pid < NUM_PUSHERS:
        push_rows(a, stride_am, gathered, flags, sync, epoch, ctrl, heap_bases, trace_buf,
                  rank, world_size, m_local, K, num_mb, pid, fp, tl.arange(0, COPY_M),
                  tl.arange(0, COPY_K), NUM_PUSHERS, BM, COPY_M, COPY_K, TRACE)
    else:
        num_nb = tl.cdiv(N, BN)
        num_tiles = num_mb * num_nb
        a_op = operand(gathered, M, K, K, BM, BK, TMA)
        w_op = operand(w, N, K, stride_wn, BN, BK, TMA)
        u = take_tile(sync, pid - NUM_PUSHERS, PERSISTENT)
        while u < num_tiles * split_k:
            if SPLIT:
                t = u // split_k
            else:
                t = u
            mb, nb = arrival_tile(t, rank, world_size, m_local, num_mb, num_nb, BM, GROUP_M,
                                  ALIGNED)
            m0 = mb * BM
            m_end = tl.minimum(m0 + BM, M)
            t0 = trd.begin(TRACE)
            ok = wait_rows(flags, mb, m0, m_end, m_local, num_mb, epoch, fp, ctrl, rank)
            if TMA:       # the rows came through generic stores; TMA reads the async proxy
                tdl.fence_async_proxy()
            trd.end(trace_buf, t0, tags.WAIT, rank, TRACE)
            t0 = trd.begin(TRACE)
            acc = op_tile(a_op, K, w_op, stride_wn, m0, nb * BN, M, N, K, u - t * split_k,
                          split_k, BM, BN, BK, EVEN_K, TMA, SWAP_AB, SPLIT)
            acc = poison(acc, ok)      # a slice of a failed wait spoils its whole tile
            if SPLIT:
                last, acc = finish_slice(acc, k_partials, k_counters, t, u - t * split_k,
                                         split_k, BM, BN)
            else:
                last = True
            if last:
                acc = add_bias(acc, bias, nb * BN, N, BN, HAS_BIAS)
                store_tile(out, stride_om, acc, m0, nb * BN, m_end, N, BM, BN)
            trd.end(trace_buf, t0, tags.GEMM_TILE, rank, TRACE)
            u = take_tile(sync, num_tiles * split_k, PERSISTENT)
    finish_program(sync, epoch, rank, world_size, heap_bases)


def all_gather_matmul_fused(ctx, plan, a, w, bias, out, num_pushers: int | None = None,
                            config: dict | None = None, gemm: str | None = None,
                            split_k: int | None = None) -> None:
    """Add the fused kernel's launch to `plan` (inputs already checked; `out` is the
    call's tensor 3, launched as Live(3)). gemm: the GEMM core, "auto", "classic", "tma"
    or "gluon" (default: env TRIDENT_GEMM, see _common; "gluon": fused_gluon.py's kernel
    where it can run, else the "tma" core); config: overrides of the core's config
    (SWAP_AB, SPLIT_K, tiles); split_k: exactly this many K slices per tile (default:
    fused_tile.split_count's choice). The row block follows M and K only (every rank
    pushes and flags the same blocks), not this rank's N."""
    m_local, K = a.shape
    N = w.shape[0]
    M = m_local * ctx.world_size
    cfg = fused_gemm_config(ctx, M, N, K, gemm, config, group_m=8, local="N", gluon=True)
    ws = workspace(ctx, "all_gather_matmul", M * K * a.element_size(),
                   2 * ctx.world_size * triton.cdiv(M, tile_shape(cfg)[0]))  # flag + fp a block
    gathered = ws.view(a.dtype, M, K)
    if cfg["CORE"] == "gluon" and not tma_compatible(w, gathered):
        cfg = cfg["FALLBACK"]          # this rank's w: the Triton kernel, the same BM
    bm, bn = tile_shape(cfg)
    num_tiles = count_tiles("all_gather_matmul", M, N, ctx.world_size, cfg)
    split = split_count(ctx, cfg, num_tiles, K, split_k)
    k_partials, k_counters = split_buffers(ws, "all_gather_matmul", cfg, num_tiles, split)
    # TMA reads the gathered rows (row stride K: 16-byte aligned when K % 8 == 0) and w
    tma = cfg["PERSISTENT"] and K % 8 == 0 and tma_compatible(w, gathered)
    per_rank_items = triton.cdiv(m_local, bm) + 1
    if num_pushers is None:
        num_pushers = 16 if ctx.backend == "cuda" else 2
    num_pushers = max(1, min(num_pushers, per_rank_items))
    copy_m, copy_k = (32, 256) if ctx.backend == "cuda" else (16, 32)
    grid = (num_pushers + gemm_programs(ctx, cfg, num_tiles * split,
                                        tma and cfg["CORE"] != "gluon"),)
    trace_buf, trace = kernel_args(ctx)
    # one fingerprint for both kernels: the protocol, not the kernel, is what ranks share
    fp = fingerprint(_all_gather_matmul_kernel, M, K, str(a.dtype), bm, ctx.world_size)
    if cfg["CORE"] == "gluon":
        from . import fused_gluon
        descs = fused_gluon.descriptors(gathered, w, cfg)
        plan.launch(
            fused_gluon._all_gather_matmul_gluon_kernel, grid, a, *descs,
            bias if bias is not None else a, Live(3), gathered, ws.sync, ctx.ctrl,
            ctx.heap_bases, trace_buf, k_partials, k_counters, split, ctx.rank,
            ctx.world_size, m_local, M, N, K, a.stride(0), out.stride(0), fp,
            **fused_gluon.constexprs(cfg, num_pushers, copy_m, copy_k, m_local % bm == 0,
                                     bias is not None, split > 1, trace))
        addresses_only(plan.steps[-1], descs)
        return
    plan.launch(
        _all_gather_matmul_kernel, grid,
        a, w, bias if bias is not None else a, Live(3), gathered, ws.sync, ctx.ctrl,
        ctx.heap_bases, trace_buf, k_partials, k_counters, split, ctx.rank, ctx.world_size,
        m_local, M, N, K, a.stride(0), w.stride(0), out.stride(0), fp,
        NUM_PUSHERS=num_pushers, BM=bm, BN=bn, BK=cfg["BK"],
        GROUP_M=cfg["GROUP_M"], COPY_M=copy_m, COPY_K=copy_k,
        EVEN_K=K % cfg["BK"] == 0, ALIGNED=m_local % bm == 0, HAS_BIAS=bias is not None,
        PERSISTENT=cfg["PERSISTENT"], TMA=tma, SWAP_AB=cfg["SWAP_AB"], SPLIT=split > 1,
        TRACE=trace,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def all_gather_matmul(ctx, a, w, bias=None, out=None, schedule: str = "auto",
                      algorithm: str | None = None, **options) -> torch.Tensor:
    """all_gather(a, dim 0) @ w.T + bias -> [world * a.shape[0], w.shape[0]].

    schedule: "auto" (auto.py's choice), "fused" (one kernel, pushers and GEMM programs),
    "sequential" (trident's all_gather, then cuBLAS), "epilogue" (one kernel whose GEMM
    programs pull the rows of A they need from the peers), "pipelined", "async_tp" (torch's
    fused_all_gather_matmul; GPUs of their own) or "plain" (also "nccl": NCCL all-gather +
    cuBLAS); see schedules.py. algorithm: the older name of
    schedule. options go to the schedule (fused: num_pushers, config, split_k, gemm:
    "auto", "classic", "tma" or "gluon", default env TRIDENT_GEMM, see all_gather_matmul_fused;
    sequential: collective; epilogue: config).
    """
    if is_compiling():             # torch.compile traces its stand-in (runtime/compiled.py)
        return STANDINS["all_gather_matmul"](ctx, a, w, bias, out, schedule, algorithm, **options)
    name = schedules.normalize("all_gather_matmul", schedule, algorithm, ctx)
    return run(ctx, "all_gather_matmul", _plan, a, w, bias, out, name, options)


def _plan(ctx, a, w, bias, out, name, options) -> Plan:
    check_matrices(ctx, "all_gather_matmul", a, w, bias, out)
    M = a.shape[0] * ctx.world_size
    check_inputs(ctx, "all_gather_matmul", a, w, bias, out, (M, w.shape[0]))
    return schedule_plan(ctx, "all_gather_matmul", a, w, bias, out, (M, w.shape[0]), name,
                         options, M, w.shape[0], a.shape[1])
