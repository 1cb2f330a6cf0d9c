"""The row-parallel ops' third GEMM core, gemm="gluon" (matmul_reduce_scatter and
matmul_all_reduce, schedule "fused"): their fused kernel with warp-specialised GEMM
programs written in Gluon (gemm_ws.py's producer warp and consumer warp groups).

One launch, as the Triton kernel of matmul_reduce_scatter.py: programs 0 .. num_gemm-1
are persistent GEMM programs; the higher ones are its reducers and, for all-reduce, its
gather programs, the same code (reduce_tiles.reduce_slot / gather_tile: the same slots,
flags, fingerprints and acks, so a rank on this kernel and one on the Triton kernel
interoperate where their tiles agree). Each GEMM program is split by gl.warp_specialize
into
- a producer partition (one warp) that takes the next work unit from the workspace's tile
  queue (SYNC_QUEUE, the "tma" core's), hands it to the consumers (fused_ws.hand_over),
  and issues the TMA loads of the unit's K steps (a and w through host-made
  descriptors) into a ring of STAGES shared-memory slots (gemm_ws.load_step);
- the default partition (CONSUMER_WARPS warps, one or two warp groups) that takes each
  unit, runs its wgmma over the ring (gemm_ws.mma_steps), and, as the Triton kernel does,
  pushes the finished partial tile in the input dtype into its slot on the tile's owner
  (reduce_tiles.push_partial: 16-byte stores, then the slot's flag) -- or, split in K,
  goes through split-K's fix-up first (gemm_ws.sum_slices, the Triton kernel's
  finish_slice layout: the last slice pushes the sum of the slices in slice order).
The units and tiles are the Triton kernel's (reduce_tiles.unit_tile / tile_of: the same
owner order), so a tile's partial, its slot and its flag are the same on either kernel;
the reducers sum the world's partials in rank order as before, so matmul_all_reduce stays
bitwise the same on every rank (one rank reduces each tile; the others copy it).

Waits. The producer waits for nothing (a and w are this rank's own); the consumers wait
for the owner's ack of the previous call before a push (reduce_tiles.push_partial, its
vote over the default partition's threads: THREADS = 32 * CONSUMER_WARPS, the count
Triton gives barrier 0 inside that partition), as the Triton kernel's GEMM programs do;
the reducers and gather programs run outside the partitions in the default warps alone
(the worker warp idles there) and vote over the same threads. A failed wait poisons what
it guards (the reducers' and gathers' tiles: NaN) and the push it guards is not made.

Why the other roles are extra programs of the same grid: fused_gluon.py's docstring
(Gluon runs code outside gl.warp_specialize in the default warps alone; nothing waits on
a program of a later id or of another launch).

What it needs: an sm_90 GPU, bf16/fp16, a and w TMA can address (each rank's own: a rank
whose a or w cannot be, e.g. a column slice with unaligned rows, runs the "tma" kernel
with the same tiles and GROUP_M, FALLBACK), configs with BM a multiple of 64 and no
swap-AB (fused_tile.fused_gemm_config checks). The Triton interpreter cannot run Gluon's
shared memory, TMA or mbarriers, so the CPU emulation never launches this kernel;
tests/compile/sm90.py compiles it for sm_90.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .. import language as tdl
from ..trace import device as trd
from ..trace import tags
from ._common import SYNC_EPOCH, SYNC_FLAGS, finish_program, take_tile
from .fused_ws import alloc_rings, hand_over, hand_over_end, next_unit, release_rings
from .gemm_ws import load_step, mma_steps, sum_slices, wgmma_shape
from .reduce_tiles import gather_tile, push_partial, reduce_slot, tile_of, unit_tile


@gluon.jit
def _producer(a_desc, w_desc, a_bufs, w_bufs, ready, empty, ids, id_ready, id_empty, sync,
              rank, world_size, M, N, K, m_local, num_tiles, split_k, GROUP_M: gl.constexpr,
              STAGES: gl.constexpr, ALL_REDUCE: gl.constexpr, SPLIT: gl.constexpr):
    """One warp: per unit of the queue, the hand-over, then the TMA loads of its K steps."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[0]
    k_steps = gl.cdiv(K, BK)
    i = 0
    j = 0
    u = take_tile(sync, 0, True)
    while u < num_tiles * split_k:
        t, q = unit_tile(u, split_k, rank, world_size, num_tiles, SPLIT, ALL_REDUCE)
        m0, m_end, n0, owner, slot = tile_of(t, rank, world_size, M, N, m_local, BM, BN,
                                             GROUP_M, ALL_REDUCE)
        hand_over(ids, id_ready, id_empty, j, u, u >= 0, STAGES)    # nothing waited for
        j += 1
        s = u - q * split_k
        for k in range(s * k_steps // split_k, (s + 1) * k_steps // split_k):
            load_step(a_desc, w_desc, a_bufs, w_bufs, ready, empty, i, m0, n0, k, STAGES)
            i += 1
        u = take_tile(sync, 0, True)
    hand_over_end(ids, id_ready, id_empty, j, STAGES)


@gluon.jit
def _consumer(partials, flags, sync, ctrl, heap_bases, trace_buf, k_partials, k_counters,
              a_bufs, w_bufs, ready, empty, ids, id_ready, id_empty, epoch, fp, rank,
              world_size, M, N, K, m_local, num_tiles, slots, split_k, BM: gl.constexpr,
              BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr,
              STAGES: gl.constexpr, ALL_REDUCE: gl.constexpr, SPLIT: gl.constexpr,
              OP: gl.constexpr, TRACE: gl.constexpr, NUM_WARPS: gl.constexpr,
              WARPS_M: gl.constexpr, INSTR_N: gl.constexpr, TPW_N: gl.constexpr):
    """The default partition: per unit handed over, its wgmma, its split-K fix-up (SPLIT),
    then the push of the finished partial to the tile's owner."""
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS_M, NUM_WARPS // WARPS_M],
        instr_shape=[16, INSTR_N, 16])
    stored: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPW_N, TPW_N], [NUM_WARPS, 1],
                                            [1, 0])
    k_steps = gl.cdiv(K, BK)
    r = gl.arange(0, BM, layout=gl.SliceLayout(1, stored))
    c = gl.arange(0, BN, layout=gl.SliceLayout(0, stored))
    offs = r[:, None] * BN + c[None, :]
    i = 0
    j = 0
    v = next_unit(ids, id_ready, id_empty, j, STAGES, NUM_WARPS)
    while v >= 0:
        t0 = trd.begin(TRACE)
        u = v // 2
        t, q = unit_tile(u, split_k, rank, world_size, num_tiles, SPLIT, ALL_REDUCE)
        m0, m_end, n0, owner, slot = tile_of(t, rank, world_size, M, N, m_local, BM, BN,
                                             GROUP_M, ALL_REDUCE)
        s = u - q * split_k
        acc = gl.zeros((BM, BN), dtype=gl.float32, layout=layout)
        acc, i = mma_steps(a_bufs, w_bufs, ready, empty, acc, i, s * k_steps // split_k,
                           (s + 1) * k_steps // split_k, STAGES)
        y = gl.convert_layout(acc, stored)
        last = True
        if SPLIT:    # the tile is this rank's whole partial only once all slices are in
            last, y = sum_slices(y, k_partials + t.to(gl.int64) * split_k * (BM * BN),
                                 k_counters + t, s, split_k, offs, BM * BN)
        trd.end(trace_buf, t0, tags.GEMM_TILE, rank, TRACE)
        if last:
            push_partial(y, partials, flags, sync, ctrl, heap_bases, trace_buf, epoch, fp,
                         rank, owner, slot, slots, offs, BM, BN, OP, TRACE, 32 * NUM_WARPS)
        j += 1
        v = next_unit(ids, id_ready, id_empty, j, STAGES, NUM_WARPS)


@gluon.jit
def _matmul_reduce_gluon_kernel(
        a_desc, w_desc, bias, out, partials, result, sync, ctrl, heap_bases, trace_buf,
        k_partials, k_counters, split_k, rank, world_size, M, N, K, m_local, stride_om,
        num_tiles, slots, num_gemm, fp, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
        HAS_BIAS: gl.constexpr, ALL_REDUCE: gl.constexpr, SPLIT: gl.constexpr,
        OP: gl.constexpr, TRACE: gl.constexpr, CONSUMER_WARPS: gl.constexpr,
        WARPS_M: gl.constexpr, INSTR_N: gl.constexpr, TPW_N: gl.constexpr):
    """The arguments of matmul_reduce_scatter._matmul_reduce_kernel, but a and w as host
    TensorDescriptors (a_desc [M, K] in blocks [BM, BK], w_desc [N, K] in blocks [BN,
    BK], NVMMA shared layouts) and without the pointer path's strides. SPLIT: split_k (>
    1) K slices per tile with the workspace's split-K buffers (fused_tile.split_buffers),
    else split_k 1. Launched with num_warps=CONSUMER_WARPS (the producer's warp on top)."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[0]
    pid = gl.program_id(0)
    epoch = tdl.launch_epoch(sync + SYNC_EPOCH)
    flags = sync + SYNC_FLAGS                 # [world, slots] x (flag, fingerprint)
    ready = flags + 2 * world_size * slots    # [num_tiles] x 2: reduced tile (all-reduce)
    if pid < num_gemm:
        a_bufs, w_bufs, ready_k, empty_k, ids, id_ready, id_empty = alloc_rings(
            a_desc, w_desc, STAGES)
        gl.warp_specialize([
            (_consumer, (partials, flags, sync, ctrl, heap_bases, trace_buf, k_partials,
                         k_counters, a_bufs, w_bufs, ready_k, empty_k, ids, id_ready,
                         id_empty, epoch, fp, rank, world_size, M, N, K, m_local, num_tiles,
                         slots, split_k, BM, BN, BK, GROUP_M, STAGES, ALL_REDUCE, SPLIT, OP,
                         TRACE, CONSUMER_WARPS, WARPS_M, INSTR_N, TPW_N)),
            (_producer, (a_desc, w_desc, a_bufs, w_bufs, ready_k, empty_k, ids, id_ready,
                         id_empty, sync, rank, world_size, M, N, K, m_local, num_tiles,
                         split_k, GROUP_M, STAGES, ALL_REDUCE, SPLIT)),
        ], [1], [40])
        release_rings(ready_k, empty_k, id_ready, id_empty, STAGES)
    else:
        # the reducers and gather programs: 16-byte accesses, 8 columns a thread
        tile: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPW_N, TPW_N],
                                              [CONSUMER_WARPS, 1], [1, 0])
        rows = gl.arange(0, BM, layout=gl.SliceLayout(1, tile))
        cols = gl.arange(0, BN, layout=gl.SliceLayout(0, tile))
        offs = rows[:, None] * BN + cols[None, :]
        if pid < num_gemm + slots:
            reduce_slot(pid - num_gemm, gl.zeros((BM, BN), dtype=gl.float32, layout=tile),
                        offs, rows, cols, out, bias, partials, result, flags, ready, sync,
                        ctrl, heap_bases, trace_buf, epoch, fp, rank, world_size, M, N,
                        m_local, stride_om, num_tiles, slots, BM, BN, GROUP_M, HAS_BIAS,
                        ALL_REDUCE, OP, TRACE, 32 * CONSUMER_WARPS)
        else:
            gather_tile(pid - num_gemm - slots, offs, rows, cols, out, result, ready, ctrl,
                        heap_bases, trace_buf, epoch, fp, rank, world_size, M, N, m_local,
                        stride_om, BM, BN, GROUP_M, ALL_REDUCE, OP, TRACE,
                        32 * CONSUMER_WARPS)
    finish_program(sync, epoch, rank, world_size, heap_bases)


def constexprs(cfg: dict, has_bias: bool, all_reduce: bool, split: bool, op: int,
               trace: bool) -> dict:
    """The kernel's constexprs and launch options for a gluon config `cfg`
    (fused_tile.fused_gemm_config: BM, BN, BK, GROUP_M, num_stages, num_warps)."""
    warps_m, instr_n = wgmma_shape(cfg["BM"], cfg["BN"], cfg["num_warps"])
    return dict(GROUP_M=cfg["GROUP_M"], STAGES=cfg["num_stages"], HAS_BIAS=has_bias,
                ALL_REDUCE=all_reduce, SPLIT=split, OP=op, TRACE=trace,
                CONSUMER_WARPS=cfg["num_warps"], WARPS_M=warps_m, INSTR_N=instr_n,
                TPW_N=min(32, cfg["BN"] // 8), num_warps=cfg["num_warps"])
