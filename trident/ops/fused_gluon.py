"""all_gather_matmul's third GEMM core, gemm="gluon": the fused kernel with warp-specialised
GEMM programs written in Gluon (gemm_ws.py's producer warp and consumer warp groups).

One launch, as the Triton kernel of all_gather_matmul.py: programs 0 .. NUM_PUSHERS-1 are
its pushers, the same code (gather_rows.push_rows: the same blocks, flags, fingerprints and
acks, so a rank on this kernel and one on the Triton kernel interoperate); the higher ones
are persistent GEMM programs, each split by gl.warp_specialize into
- a producer partition (one warp) that takes the next work unit from the workspace's tile
  queue (SYNC_QUEUE, the "tma" core's), in the same arrival order (gather_rows.
  arrival_tile: this rank's block first), waits (bounded, acquire, system scope:
  gather_rows.wait_rows, the Triton kernel's wait, its errors recorded in the ctrl word
  the same way) for the flags of the unit's row block, fences the async proxy
  (tdl.fence_async_proxy: the rows came through generic stores, TMA reads through the
  async proxy), hands the unit and the wait's verdict to the consumers, then issues the
  TMA loads of its K steps -- A from the gathered buffer, W, both through host-made
  descriptors -- into a ring of STAGES shared-memory slots (gemm_ws.load_step);
- the default partition (CONSUMER_WARPS warps, one or two warp groups) that takes each
  unit from the producer, runs its wgmma over the ring (gemm_ws.mma_steps), poisons the
  tile (NaN) where the verdict says the wait failed, and then, as the Triton kernel does,
  either stores it (bias, masked stores) or, split in K, goes through split-K's fix-up
  (gemm_ws.sum_slices: the last slice stores the sum).
Every program ends in _common.finish_program (the last one rearms the queue and acks).

Why pushers as extra programs of this kernel, not a partition and not a second launch.
Gluon runs a kernel's code outside gl.warp_specialize in the default warps alone (the
worker warps wait idle), so a program may take the pusher branch and never enter the
partitions: the pushers stay what they are, programs of the same grid, and nothing waits
on a kernel that might not be resident (a second launch on the stream would start only
after the pushers' kernel ended, and two streams would need both kernels resident). As a
partition of each GEMM program they would share its registers and shared memory and need
their own split of the rows; not tried.

The hand-over (fused_ws.py). The producer waits and the consumers poison, so the verdict
goes with the unit: a ring of STAGES int32 slots in shared memory (`ids`, each with
`id_ready` / `id_empty` mbarriers as the data ring has), holding 2 * unit + ok, or -1 when
the queue is empty. The consumers cannot decide themselves: a flag that arrives after the
producer's wait gave up would pass a wait of theirs while the rows they computed with
were loaded before it.

Waits inside partitions. tdl.wait's vote is a barrier of the program by default
(bar.red on barrier 0 over every thread of the block), which the idle worker warps never
reach: here the pushers vote over the default warps' threads (THREADS = 32 *
CONSUMER_WARPS, the count Triton gives barrier 0 there) and the producer over its warp
(THREADS = 32: vote.sync, no barrier).

Memory ordering of the rows: the pusher's generic stores, then its signal (a barrier of the
program, then a release at system scope); here each thread of the producer warp reads the
flag with ld.acquire.sys, then runs fence.proxy.async.global, and the TMA copies are
issued after both by a thread of that warp -- the pattern of the "tma" core, where the
program that waited issues the copies.

What it needs: an sm_90 GPU, bf16/fp16, K % 8 == 0 (16-byte rows of the gathered buffer)
and a w TMA can address, configs with BM a multiple of 64 and no swap-AB
(fused_tile.fused_gemm_config checks; elsewhere all_gather_matmul runs the "tma" core).
The Triton interpreter cannot run Gluon's shared memory, TMA or mbarriers, so the CPU
emulation never launches this kernel; tests/compile/sm90.py compiles it for sm_90.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .. import language as tdl
from ..trace import device as trd
from ..trace import tags
from ._common import SYNC_EPOCH, SYNC_FLAGS, finish_program, take_tile
from .fused_ws import alloc_rings, hand_over, hand_over_end, next_unit, release_rings
from .gather_rows import arrival_tile, push_rows, wait_rows
from .gemm_ws import (GL_DTYPES, load_step, mma_steps, store_out, sum_slices,
                      wgmma_shape)
from ..ccl.device import poison


@gluon.jit
def _producer(a_desc, w_desc, a_bufs, w_bufs, ready, empty, ids, id_ready, id_empty, sync,
              flags, ctrl, trace_buf, epoch, fp, rank, world_size, m_local, M, N, K,
              split_k, GROUP_M: gl.constexpr, STAGES: gl.constexpr, ALIGNED: gl.constexpr,
              TRACE: gl.constexpr):
    """One warp: per unit of the queue, the rows' wait, the hand-over, the TMA loads."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[0]
    num_mb = gl.cdiv(M, BM)
    num_nb = gl.cdiv(N, BN)
    num_units = num_mb * num_nb * split_k
    k_steps = gl.cdiv(K, BK)
    i = 0
    j = 0
    u = take_tile(sync, 0, True)
    while u < num_units:
        t = u // split_k
        s = u - t * split_k
        mb, nb = arrival_tile(t, rank, world_size, m_local, num_mb, num_nb, BM, GROUP_M,
                              ALIGNED)
        m0 = mb * BM
        t0 = trd.begin(TRACE)
        ok = wait_rows(flags, mb, m0, gl.minimum(m0 + BM, M), m_local, num_mb, epoch, fp,
                       ctrl, rank, 32)
        tdl.fence_async_proxy()   # generic stores brought the rows; TMA reads async
        trd.end(trace_buf, t0, tags.WAIT, rank, TRACE)
        hand_over(ids, id_ready, id_empty, j, u, ok, STAGES)
        j += 1
        for k in range(s * k_steps // split_k, (s + 1) * k_steps // split_k):
            load_step(a_desc, w_desc, a_bufs, w_bufs, ready, empty, i, m0, nb * BN, k,
                      STAGES)
            i += 1
        u = take_tile(sync, 0, True)
    hand_over_end(ids, id_ready, id_empty, j, STAGES)            # the queue is empty


@gluon.jit
def _consumer(out, bias, k_partials, k_counters, a_bufs, w_bufs, ready, empty, ids,
              id_ready, id_empty, trace_buf, rank, world_size, m_local, M, N, K, stride_om,
              split_k, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
              GROUP_M: gl.constexpr, STAGES: gl.constexpr, ALIGNED: gl.constexpr,
              HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr, TRACE: gl.constexpr,
              NUM_WARPS: gl.constexpr, WARPS_M: gl.constexpr, INSTR_N: gl.constexpr,
              TPW_N: gl.constexpr):
    """The default partition: per unit handed over, its wgmma, poison, then its store or
    its split-K fix-up (the last slice stores the tile)."""
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS_M, NUM_WARPS // WARPS_M],
        instr_shape=[16, INSTR_N, 16])
    stored: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPW_N, TPW_N], [NUM_WARPS, 1],
                                            [1, 0])
    num_mb = gl.cdiv(M, BM)
    num_nb = gl.cdiv(N, BN)
    k_steps = gl.cdiv(K, BK)
    r = gl.arange(0, BM, layout=gl.SliceLayout(1, stored))
    c = gl.arange(0, BN, layout=gl.SliceLayout(0, stored))
    i = 0
    j = 0
    v = next_unit(ids, id_ready, id_empty, j, STAGES, NUM_WARPS)   # 2 * unit + ok, or -1
    while v >= 0:
        t0 = trd.begin(TRACE)
        u = v // 2
        t = u // split_k
        s = u - t * split_k
        mb, nb = arrival_tile(t, rank, world_size, m_local, num_mb, num_nb, BM, GROUP_M,
                              ALIGNED)
        acc = gl.zeros((BM, BN), dtype=gl.float32, layout=layout)
        acc, i = mma_steps(a_bufs, w_bufs, ready, empty, acc, i, s * k_steps // split_k,
                           (s + 1) * k_steps // split_k, STAGES)
        y = poison(gl.convert_layout(acc, stored), (v % 2) == 1)   # a failed wait: NaN
        last = True
        if SPLIT:
            last, y = sum_slices(y, k_partials + t.to(gl.int64) * split_k * (BM * BN),
                                 k_counters + t, s, split_k, r[:, None] * BN + c[None, :],
                                 BM * BN)
        if last:
            store_out(y, out, bias, mb * BM + r, nb * BN + c, M, N, stride_om, HAS_BIAS)
        trd.end(trace_buf, t0, tags.GEMM_TILE, rank, TRACE)
        j += 1
        v = next_unit(ids, id_ready, id_empty, j, STAGES, NUM_WARPS)


@gluon.jit
def _all_gather_matmul_gluon_kernel(
        a, a_desc, w_desc, bias, out, gathered, sync, ctrl, heap_bases, trace_buf,
        k_partials, k_counters, split_k, rank, world_size, m_local, M, N, K, stride_am,
        stride_om, fp, NUM_PUSHERS: gl.constexpr, COPY_M: gl.constexpr,
        COPY_K: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
        ALIGNED: gl.constexpr, HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr,
        TRACE: gl.constexpr, CONSUMER_WARPS: gl.constexpr, WARPS_M: gl.constexpr,
        INSTR_N: gl.constexpr, TPW_N: gl.constexpr):
    """a: this rank's rows (pointer, row stride stride_am); a_desc: the gathered buffer [M,
    K] in blocks [BM, BK], w_desc: w [N, K] in blocks [BN, BK] (host TensorDescriptors,
    NVMMA shared layouts); gathered: the same buffer as a pointer (the pushers' stores);
    out [M, N] (row stride stride_om); bias [N] or any pointer (not read without
    HAS_BIAS). SPLIT: split_k (> 1) K slices per tile, unit u = (tile u // split_k, slice
    u % split_k), with the workspace's split-K buffers (fused_tile.split_buffers); else
    split_k 1. Launched with num_warps=CONSUMER_WARPS (the producer's warp on top)."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[0]
    pid = gl.program_id(0)
    epoch = tdl.launch_epoch(sync + SYNC_EPOCH)
    flags = sync + SYNC_FLAGS
    if pid < NUM_PUSHERS:
        # a 16-byte vector of bf16/fp16 a thread, a warp along 256 columns of K (COPY_K)
        copy: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [CONSUMER_WARPS, 1], [1, 0])
        push_rows(a, stride_am, gathered, flags, sync, epoch, ctrl, heap_bases, trace_buf,
                  rank, world_size, m_local, K, gl.cdiv(M, BM), pid, fp,
                  gl.arange(0, COPY_M, layout=gl.SliceLayout(1, copy)),
                  gl.arange(0, COPY_K, layout=gl.SliceLayout(0, copy)),
                  NUM_PUSHERS, BM, COPY_M, COPY_K, TRACE, 32 * CONSUMER_WARPS)
    else:
        a_bufs, w_bufs, ready, empty, ids, id_ready, id_empty = alloc_rings(a_desc, w_desc,
                                                                            STAGES)
        gl.warp_specialize([
            (_consumer, (out, bias, k_partials, k_counters, a_bufs, w_bufs, ready, empty, ids,
                         id_ready, id_empty, trace_buf, rank, world_size, m_local, M, N, K,
                         stride_om, split_k, BM, BN, BK, GROUP_M, STAGES, ALIGNED, HAS_BIAS,
                         SPLIT, TRACE, CONSUMER_WARPS, WARPS_M, INSTR_N, TPW_N)),
            (_producer, (a_desc, w_desc, a_bufs, w_bufs, ready, empty, ids, id_ready,
                         id_empty, sync, flags, ctrl, trace_buf, epoch, fp, rank, world_size,
                         m_local, M, N, K, split_k, GROUP_M, STAGES, ALIGNED, TRACE)),
        ], [1], [40])
        release_rings(ready, empty, id_ready, id_empty, STAGES)
    finish_program(sync, epoch, rank, world_size, heap_bases)


def constexprs(cfg: dict, num_pushers: int, copy_m: int, copy_k: int, aligned: bool,
               has_bias: bool, split: bool, trace: bool) -> dict:
    """The kernel's constexprs and launch options for a gluon config `cfg`
    (fused_tile.fused_gemm_config: BM, BN, BK, GROUP_M, num_stages, num_warps)."""
    warps_m, instr_n = wgmma_shape(cfg["BM"], cfg["BN"], cfg["num_warps"])
    return dict(NUM_PUSHERS=num_pushers, COPY_M=copy_m, COPY_K=copy_k,
                GROUP_M=cfg["GROUP_M"], STAGES=cfg["num_stages"], ALIGNED=aligned,
                HAS_BIAS=has_bias, SPLIT=split, TRACE=trace,
                CONSUMER_WARPS=cfg["num_warps"], WARPS_M=warps_m, INSTR_N=instr_n,
                TPW_N=min(32, cfg["BN"] // 8), num_warps=cfg["num_warps"])


def descriptors(gathered, w, cfg: dict) -> tuple:
    """Host TensorDescriptors of the gathered buffer [M, K] and w [N, K], blocks [BM, BK]
    and [BN, BK] (gemm_ws.descriptors' kind)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    dt = GL_DTYPES[gathered.dtype]
    return tuple(TensorDescriptor(t, list(t.shape), [t.stride(0), 1], block,
                                  gl.NVMMASharedLayout.get_default_for(block, dt))
                 for t, block in ((gathered, [cfg["BM"], cfg["BK"]]),
                                  (w, [cfg["BN"], cfg["BK"]])))
