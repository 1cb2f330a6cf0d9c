"""matmul_reduce_scatter: out [M/world, N] = reduce_scatter(a @ w.T, dim 0) + bias
(row-parallel linear). a: [M, K_local], w: [N, K_local], bias: [N] added once.

One launch, two roles (three for matmul_all_reduce, which shares this kernel):
- GEMM programs (the low ids) compute one [BM, BN] tile of this rank's partial product
  each and push it, in the input dtype, into the tile's slot for this rank on the tile's
  owner (the rank whose rows it holds; 16-byte stores over NVLink, tile-shaped slots so
  each push is one contiguous block), then set the slot's flag there (release). Tiles
  are taken owner by owner starting at rank+1, so that this rank's own tiles -- which
  need no transfer -- come last and cover the tail of the transfers.
- Reducer programs (higher ids: they wait on GEMM programs) own one slot of this rank's
  rows each: they wait for the flags of all ranks, add the partials in fp32 in rank
  order, add the bias and store the result.
- all-reduce only: every rank owns tiles round-robin instead of a row range; a reducer
  also writes its sum into a heap tile and flags it on every rank, and gather programs
  (the highest ids) copy the tiles other ranks own from there into `out`.

The GEMM core (_common: env TRIDENT_GEMM, or the gemm= option):
- "classic": one GEMM program per tile, pointer loads, tiles of an owner row by row.
- "tma": persistent GEMM programs, at most one per SM, take tiles from a queue word in the
  same owner order (grouped GROUP_M row blocks at a time within an owner's rows), load A
  and W through TMA descriptors made on the host (once per plan: the launch needs no
  global scratch) where gemm.tma_compatible allows (pointer loads otherwise, e.g. a
  column slice of a wider A whose rows are not 16-byte aligned), and
  push each finished tile to its owner as before. Reducers and gather programs start
  after them (higher ids) and are unchanged; the slot layout follows the tile order, so
  the all-reduce result is still bitwise the same on every rank.
- Either core runs swap-AB and split-K configs (fused_tile.py): a tile is still a block
  of out, and with split-K only its last slice, once the slices are summed in slice
  order, pushes it and sets the flag; the reducers do not change.
- "gluon" (matmul_reduce_gluon.py): the same reducers and gather programs, and persistent
  GEMM programs that are warp specialised in Gluon -- a producer warp issuing the TMA
  loads into a ring of mbarrier slots, consumer warp groups issuing the wgmma and pushing
  each finished tile (gemm_ws.py's kernel) -- from the same queue, in the same order,
  into the same slots. An sm_90 GPU (else, and on the CPU emulation, the "tma" core; a
  or w that TMA cannot address: the "tma" kernel with the same tiles, on that rank
  alone); plain and split-K configs, no swap-AB. Not yet measured with a GPU per rank,
  so "auto" never takes it.
The tiles' order, the push, the reducers and the gathers are one code for both kernels
(reduce_tiles.py), and a rank on either kernel exchanges the same slots, flags and
fingerprint (which names the tiles and their GROUP_M order: ranks whose tiles differ
are refused, CallMismatch or CommTimeout, never mixed).
To be measured on 2 GPUs (`trident bench ops`, TRIDENT_GEMM=tma against classic): the
fused time per shape, and reducers that start only as GEMM programs leave their SMs
(the ready-queue reduction of issue 13 is not built yet).

When it wins: the partials cross NVLink once (M*N*2*(world-1)/world bytes out of each
GPU, like a ring reduce-scatter), overlapped with the GEMM of later tiles; the plain path
serialises cuBLAS and NCCL. Crossovers: trident/ops/crossover.json (selector.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import language as tdl
from ..runtime.errors import OP_CODES
from ..trace import device as trd
from ..trace import kernel_args, tags
from . import schedules
from ..runtime.compiled import STANDINS, is_compiling
from ..runtime.plans import Live, Plan
from ..ccl.device import fingerprint
from ._common import (SYNC_EPOCH, SYNC_FLAGS, check_inputs, check_matrices, finish_program,
                      finish_slice, run, schedule_plan, take_tile, workspace)
from .fused_tile import (fused_gemm_config, gemm_programs, num_tiles as count_tiles,
                         op_tile, split_buffers, split_count, tile_shape)
from .gemm import addresses_only, host_descriptors, operand, tma_compatible
from .reduce_tiles import gather_tile, push_partial, reduce_slot, tile_of, unit_tile


@triton.jit
def _matmul_reduce_kernel(
        a, w, bias, out, partials, result, sync, ctrl, heap_bases, trace_buf,
        k_partials, k_counters, split_k,
        rank, world_size, M, N, K, m_local, stride_am, stride_wn, stride_om,
        num_tiles, slots, num_gemm, fp,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
        EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, ALL_REDUCE: tl.constexpr,
        PERSISTENT: tl.constexpr, TMA: tl.constexpr, SWAP_AB: tl.constexpr,
        SPLIT: tl.constexpr, OP: tl.constexpr, TRACE: tl.constexpr):
    """BM x BN: the tile of out (fused_tile.tile_shape). SPLIT: split_k slices per tile,
    work unit u = (q = u // split_k: the tile in this rank's order, slice u % split_k);
    a tile is pushed and flagged only by its last slice, once summed (finish_slice).
    Flags carry the call's fingerprint (_common.signal_call / wait_call); a failed wait
    poisons the tiles it guards (NaN), and a program whose wait failed pushes and signals
    nothing more (no peer memory touched). The roles' code: reduce_tiles.py."""
    pid = tl.program_id(0)
    epoch = tdl.launch_epoch(sync + SYNC_EPOCH)
    flags = sync + SYNC_FLAGS                 # [world, slots] x (flag, fingerprint)
    ready = flags + 2 * world_size * slots    # [num_tiles] x 2: reduced tile (all-reduce)
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    rows = tl.arange(0, BM)
    cols = tl.arange(0, BN)
    if pid < num_gemm:
        # ---- GEMM: this rank's partial of one tile at a time, pushed to the tile's owner
        a_op = operand(a, M, K, stride_am, BM, BK, TMA)
        w_op = operand(w, N, K, stride_wn, BN, BK, TMA)
        u = take_tile(sync, pid, PERSISTENT)
        while u < num_tiles * split_k:
            t, q = unit_tile(u, split_k, rank, world_size, num_tiles, SPLIT, ALL_REDUCE)
            m0, m_end, n0, owner, slot = tile_of(t, rank, world_size, M, N, m_local, BM, BN,
                                                 GROUP_M, ALL_REDUCE)
            t0 = trd.begin(TRACE)
            acc = op_tile(a_op, stride_am, w_op, stride_wn, m0, n0, M, N, K, u - q * split_k,
                          split_k, BM, BN, BK, EVEN_K, TMA, SWAP_AB, SPLIT)
            if SPLIT:    # the tile is this rank's whole partial only once all slices are in
                last, acc = finish_slice(acc, k_partials, k_counters, t, u - q * split_k,
                                         split_k, BM, BN)
            else:
                last = True
            trd.end(trace_buf, t0, tags.GEMM_TILE, rank, TRACE)
            if last:
                push_partial(acc, partials, flags, sync, ctrl, heap_bases, trace_buf, epoch,
                             fp, rank, owner, slot, slots, offs, BM, BN, OP, TRACE)
            u = take_tile(sync, num_tiles * split_k, PERSISTENT)
    elif pid < num_gemm + slots:
        # ---- reduce: one slot of this rank's tiles, summed over ranks in rank order
        reduce_slot(pid - num_gemm, tl.zeros((BM, BN), dtype=tl.float32), offs, rows, cols,
                    out, bias, partials, result, flags, ready, sync, ctrl, heap_bases,
                    trace_buf, epoch, fp, rank, world_size, M, N, m_local, stride_om,
                    num_tiles, slots, BM, BN, GROUP_M, HAS_BIAS, ALL_REDUCE, OP, TRACE)
    else:
        # ---- all-reduce only: copy a tile another rank reduced into `out`
        gather_tile(pid - num_gemm - slots, offs, rows, cols, out, result, ready, ctrl,
                    heap_bases, trace_buf, epoch, fp, rank, world_size, M, N, m_local,
                    stride_om, BM, BN, GROUP_M, ALL_REDUCE, OP, TRACE)
    finish_program(sync, epoch, rank, world_size, heap_bases)


def matmul_reduce_fused(ctx, plan, a, w, bias, out, all_reduce: bool,
                        config: dict | None = None, gemm: str | None = None,
                        split_k: int | None = None) -> None:
    """Add the fused kernel's launch to `plan` (inputs already checked; `out` is the
    call's tensor 3, launched as Live(3)). gemm: the GEMM core, "auto", "classic", "tma"
    or "gluon" (default: env TRIDENT_GEMM, see _common; "gluon": matmul_reduce_gluon.py's
    kernel where it can run, else the "tma" core); config: overrides of the core's config
    (SWAP_AB, SPLIT_K, tiles); split_k: exactly this many K slices per tile (default:
    fused_tile.split_count's choice). Tile sizes and their order (GROUP_M) follow M and
    N only (every rank takes the same: they decide the slots); the slices follow this
    rank's K."""
    M, K = a.shape
    N = w.shape[0]
    world = ctx.world_size
    op = "matmul_all_reduce" if all_reduce else "matmul_reduce_scatter"
    cfg = fused_gemm_config(ctx, M, N, K, gemm, config, group_m=1, local="K", gluon=True)
    if cfg["CORE"] == "gluon" and not tma_compatible(a, w):
        cfg = cfg["FALLBACK"]       # this rank's a or w: the Triton kernel, the same tiles
    bm, bn = tile_shape(cfg)
    num_tiles = count_tiles(op, M, N, world, cfg)
    m_local = M if all_reduce else M // world
    slots = triton.cdiv(num_tiles, world)
    split = split_count(ctx, cfg, num_tiles, K, split_k)
    tile_bytes = bm * bn * a.element_size()
    num_partials = world * slots + (slots if all_reduce else 0)
    ws = workspace(ctx, op, num_partials * tile_bytes,
                   2 * (world * slots + num_tiles))     # each flag and its fingerprint
    k_partials, k_counters = split_buffers(ws, op, cfg, num_tiles, split)
    buf = ws.view(a.dtype, num_partials, bm * bn)
    partials, result = buf[:world * slots], buf[world * slots:] if all_reduce else buf
    tma = cfg["PERSISTENT"] and tma_compatible(a, w)
    num_gemm = gemm_programs(ctx, cfg, num_tiles * split, False)
    grid = (num_gemm + slots + (num_tiles if all_reduce else 0),)
    trace_buf, trace = kernel_args(ctx)
    # one fingerprint for both kernels: the protocol -- the tiles, their order (GROUP_M)
    # and so the slots -- not the kernel, is what ranks share
    fp = fingerprint(_matmul_reduce_kernel, op, M, N, str(a.dtype), bm, bn, world,
                     cfg["GROUP_M"])
    if cfg["CORE"] == "gluon":
        from . import gemm_ws, matmul_reduce_gluon
        descs = gemm_ws.descriptors(a, w, cfg)
        plan.launch(
            matmul_reduce_gluon._matmul_reduce_gluon_kernel, grid, *descs,
            bias if bias is not None else a, Live(3), partials, result, ws.sync, ctx.ctrl,
            ctx.heap_bases, trace_buf, k_partials, k_counters, split, ctx.rank, world, M, N,
            K, m_local, out.stride(0), num_tiles, slots, num_gemm, fp,
            **matmul_reduce_gluon.constexprs(cfg, bias is not None, all_reduce, split > 1,
                                             OP_CODES[op], trace))
        addresses_only(plan.steps[-1], descs)
        return
    # TMA: a and w go as host-made descriptors (gemm.operand takes them as they are), so
    # the kernel needs no global scratch -- which a launch plan would otherwise keep past
    # the call, allocated at its first run (under torch.compile: in the warm-up, inside
    # the CUDA graphs' pool)
    a_op, w_op = host_descriptors(a, w, bm, bn, cfg["BK"]) if tma else (a, w)
    plan.launch(
        _matmul_reduce_kernel, grid,
        a_op, w_op, bias if bias is not None else a, Live(3), partials, result, ws.sync, ctx.ctrl,
        ctx.heap_bases, trace_buf, k_partials, k_counters, split, ctx.rank, world, M, N,
        K, m_local, a.stride(0), w.stride(0), out.stride(0), num_tiles, slots, num_gemm, fp,
        BM=bm, BN=bn, BK=cfg["BK"], GROUP_M=cfg["GROUP_M"], EVEN_K=K % cfg["BK"] == 0,
        HAS_BIAS=bias is not None, ALL_REDUCE=all_reduce, PERSISTENT=cfg["PERSISTENT"],
        TMA=tma, SWAP_AB=cfg["SWAP_AB"], SPLIT=split > 1, OP=OP_CODES[op], TRACE=trace,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if tma:
        addresses_only(plan.steps[-1], (a_op, w_op))


def matmul_reduce_scatter(ctx, a, w, bias=None, out=None, schedule: str = "auto",
                          algorithm: str | None = None, **options) -> torch.Tensor:
    """reduce_scatter(a @ w.T, dim 0) + bias -> [a.shape[0] // world, w.shape[0]].

    a.shape[0] must be divisible by the world size. schedule: "auto" (auto.py), "fused",
    "sequential" (cuBLAS, then trident's reduce_scatter), "epilogue" (one kernel: each GEMM
    program pushes its tile to the rows' owner, which sums them), "pipelined", "async_tp"
    (torch's fused_matmul_reduce_scatter; GPUs of their own) or "plain" (also "nccl":
    cuBLAS + NCCL reduce-scatter); see schedules.py. algorithm: the older
    name of schedule. options go to the schedule (fused: config, split_k, gemm: "auto",
    "classic", "tma" or "gluon", default env TRIDENT_GEMM, see matmul_reduce_fused;
    sequential: collective; epilogue: config).
    """
    if is_compiling():             # torch.compile traces its stand-in (runtime/compiled.py)
        return STANDINS["matmul_reduce_scatter"](ctx, a, w, bias, out, schedule, algorithm,
                                                 **options)
    name = schedules.normalize("matmul_reduce_scatter", schedule, algorithm, ctx)
    return run(ctx, "matmul_reduce_scatter", _plan, a, w, bias, out, name, options)


def _plan(ctx, a, w, bias, out, name, options) -> Plan:
    check_matrices(ctx, "matmul_reduce_scatter", a, w, bias, out)
    M = a.shape[0]
    if M % ctx.world_size:
        raise ValueError(f"matmul_reduce_scatter: a has {M} rows, which is not divisible by "
                         f"the world size {ctx.world_size}")
    shape = (M // ctx.world_size, w.shape[0])
    check_inputs(ctx, "matmul_reduce_scatter", a, w, bias, out, shape, empty_k=True)
    return schedule_plan(ctx, "matmul_reduce_scatter", a, w, bias, out, shape, name,
                         options, M, w.shape[0], a.shape[1])


def _fused(ctx, plan, op, a, w, bias, out, **options) -> None:
    """The "fused" schedule of every op: the one-launch kernels of this file and
    all_gather_matmul.py."""
    if op == "all_gather_matmul":
        from .all_gather_matmul import all_gather_matmul_fused
        all_gather_matmul_fused(ctx, plan, a, w, bias, out, **options)
    else:
        matmul_reduce_fused(ctx, plan, a, w, bias, out, all_reduce=op == "matmul_all_reduce",
                            **options)


schedules.register("fused", _fused, options=("config", "gemm", "split_k", "num_pushers"),
                   about="one kernel, tiles moved as they are computed (large M)")
