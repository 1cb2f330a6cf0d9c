"""gemm_ws: the GEMM core's warp-specialised Hopper kernel, written in Gluon -- out [M, N] =
a [M, K] @ w.T (+ bias), w [N, K] in nn.Linear layout, bf16/fp16 in, fp32 accumulation.

Why a second kernel: at mid M (64-1024 rows) the Triton kernel of gemm.py runs the same
tiles and grid as cuBLAS and still loses 5-15 % (one H200, ncu: docs/history.md, "The GEMM
core at mid M"). Its k-loop is one instruction stream: every step waits for its TMA data,
issues the wgmma, waits for the previous one, and all warps meet at a barrier around each
TMA issue, so copy issue and MMA issue delay each other. cuBLAS's kernels there are warp
specialised (a producer warp group issuing TMA, consumer warp groups issuing wgmma, 6-13
stages). Triton 3.6 cannot warp-specialise gemm.py's kernel on sm_90 (the note above
CANDIDATES in gemm_configs.py); Gluon says it explicitly:

- a producer partition of one warp walks the program's tiles and their K steps and
  fills a ring of STAGES shared-memory slots by TMA, each slot with a `ready` mbarrier
  (TMA's byte count completes it) and an `empty` one (the consumers free it);
- the default partition (num_warps warps: one or two warp groups) waits for each slot,
  issues its wgmma asynchronously, waits for the one before (at most one in flight) and
  frees that one's slot; at the end of a tile it adds the bias and stores the tile
  (masked 16-byte stores), while the producer already fills the slots of its next tile;
- persistent programs (one per SM at most), tiles in gemm.py's grouped order.

An mbarrier arrival from a partition is one thread's, after a barrier of the whole
partition (so both consumer warp groups are past their wgmma wait): `empty` counts one.
Nothing waits on another program: no deadlock whatever runs at a time. The Triton
interpreter (the CPU emulation) cannot run Gluon's shared memory, TMA or mbarriers
(trident/language/gluon.py), so there the GEMM core runs gemm.py's kernel: a GLUON config
launches its TWIN (gemm._launch_of), and tests/compile/sm90.py compiles this kernel for
sm_90.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ._common import tile_position
from .gemm_host import split_workspace

GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def wgmma_shape(BM: int, BN: int, num_warps: int) -> tuple[int, int]:
    """(warps along M, wgmma's N) of the consumers' accumulator layout: warp groups stacked
    along M where BM has 64 rows per group, else side by side along N; N the widest
    multiple of 8 (at most 256) that divides a warp group's share of BN."""
    warps_m = num_warps if BM >= 16 * num_warps else 4
    share = BN // (num_warps // warps_m)
    n = min(256, share)
    while share % n or n % 8:
        n -= 8
    return warps_m, n


@gluon.jit
def _unit(unit, whole, split_k, k_steps):
    """(tile, slice, first and last + 1 BK-step) of work unit `unit`: units below `whole`
    are tiles of the same number, whole K; after them each further tile is split_k units,
    one K slice each."""
    cut = (unit >= whole).to(gl.int32)
    v = gl.maximum(unit - whole, 0)
    tile = unit + cut * (whole + v // split_k - unit)
    part = cut * (v % split_k)
    parts = 1 + cut * (split_k - 1)
    return tile, part, part * k_steps // parts, (part + 1) * k_steps // parts


@gluon.jit
def load_step(a_desc, w_desc, a_bufs, w_bufs, ready, empty, i, m0, n0, k,
              STAGES: gl.constexpr):
    """The producer's step i: once the consumers freed ring slot i % STAGES, the TMA loads
    of K step k of the tile at (m0, n0) into it (`ready` completes on their bytes)."""
    BK: gl.constexpr = a_desc.block_type.shape[1]
    nbytes: gl.constexpr = a_desc.block_type.nbytes + w_desc.block_type.nbytes
    s = i % STAGES
    # a fresh barrier is in phase 0: waiting for parity 1 passes at once, so the first
    # round of slots needs no arrival
    mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(s), nbytes)
    tma.async_copy_global_to_shared(a_desc, [m0, k * BK], ready.index(s), a_bufs.index(s))
    tma.async_copy_global_to_shared(w_desc, [n0, k * BK], ready.index(s), w_bufs.index(s))


@gluon.jit
def mma_steps(a_bufs, w_bufs, ready, empty, acc, i, k_lo, k_hi, STAGES: gl.constexpr):
    """The consumers' K steps k_lo <= k < k_hi of one unit, ring steps i, i + 1, ...: each
    waits for its slot, issues its wgmma asynchronously, waits for the one before (at
    most one in flight) and frees that one's slot; the last slot is freed once its wgmma
    is done. Returns (acc, the next ring step)."""
    for k in range(k_lo, k_hi):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(s), w_bufs.index(s).permute((1, 0)), acc,
                            is_async=True)
        # the wgmma of step i - 1 is done: free its slot
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=k > k_lo)
        i += 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=k_hi > k_lo)
    return acc, i


@gluon.jit
def sum_slices(y, first, counter, part, split_k, offs, SIZE: gl.constexpr):
    """gemm.py's deterministic split-K fix-up for slice `part` of a tile: its fp32
    partial y at first + part * SIZE (offs: the tile's offsets in the layout of y), the
    tile's counter counted acq_rel after a barrier of the partition; the last of the
    split_k slices to arrive rearms the counter to 0 and sums the partials in slice
    order. Returns (True, the sum) there, else (False, y)."""
    gl.store(first + part * SIZE + offs, y)
    gl.thread_barrier()                 # every thread's partial before the arrival
    last = gl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == split_k - 1
    if last:
        gl.store(counter, 0)                             # rearmed for the next launch
        y = gl.load(first + offs, cache_modifier=".cg")
        for q in range(1, split_k):                      # slice order: deterministic
            y += gl.load(first + q * SIZE + offs, cache_modifier=".cg")
    return last, y


@gluon.jit
def store_out(y, out, bias, rows, cols, M, N, stride_om, HAS_BIAS: gl.constexpr):
    """y (+ bias) -> out[rows, cols] in out's dtype, rows < M and cols < N only (masked
    16-byte stores through pointers)."""
    if HAS_BIAS:
        y = y + gl.load(bias + cols, mask=cols < N, other=0.0).to(gl.float32)[None, :]
    ptrs = out + rows[:, None].to(gl.int64) * stride_om + cols[None, :]
    gl.store(ptrs, y.to(out.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@gluon.jit
def _producer(a_desc, w_desc, a_bufs, w_bufs, ready, empty, num_units, whole, num_pid_m,
              num_pid_n, k_steps, split_k, GROUP_M: gl.constexpr, NUM_PROGRAMS: gl.constexpr,
              STAGES: gl.constexpr):
    """One warp: the TMA loads of every K step of every work unit of this program (_unit),
    STAGES ahead of the consumers at most, across the units' boundaries."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BN: gl.constexpr = w_desc.block_type.shape[0]
    i = 0
    for unit in range(gl.program_id(0), num_units, NUM_PROGRAMS):
        tile, part, k_lo, k_hi = _unit(unit, whole, split_k, k_steps)
        pid_m, pid_n = tile_position(tile, num_pid_m, num_pid_n, GROUP_M)
        for k in range(k_lo, k_hi):
            load_step(a_desc, w_desc, a_bufs, w_bufs, ready, empty, i, pid_m * BM,
                      pid_n * BN, k, STAGES)
            i += 1


@gluon.jit
def _consumer(out, bias, partials, counters, a_bufs, w_bufs, ready, empty, num_units,
              whole, num_pid_m, num_pid_n, k_steps, split_k, M, N, stride_om, BM: gl.constexpr,
              BN: gl.constexpr, GROUP_M: gl.constexpr, NUM_PROGRAMS: gl.constexpr,
              STAGES: gl.constexpr, HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr,
              NUM_WARPS: gl.constexpr, WARPS_M: gl.constexpr, INSTR_N: gl.constexpr,
              TPW_N: gl.constexpr):
    """The default partition: wgmma over the ring (mma_steps), then the unit's epilogue.
    SPLIT, for a unit of a split tile (tile >= whole): its fp32 partial goes to the
    split-K workspace (indexed from the first split tile) and the last of the tile's
    split_k slices to arrive sums them (sum_slices). The tile's store: bias, then masked
    16-byte stores through pointers (a fresh output has a new address every call, which
    a host descriptor made once would not follow)."""
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS_M, NUM_WARPS // WARPS_M],
        instr_shape=[16, INSTR_N, 16])
    stored: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPW_N, TPW_N], [NUM_WARPS, 1],
                                            [1, 0])
    i = 0
    for unit in range(gl.program_id(0), num_units, NUM_PROGRAMS):
        tile, part, k_lo, k_hi = _unit(unit, whole, split_k, k_steps)
        pid_m, pid_n = tile_position(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = gl.zeros((BM, BN), dtype=gl.float32, layout=layout)
        acc, i = mma_steps(a_bufs, w_bufs, ready, empty, acc, i, k_lo, k_hi, STAGES)
        y = gl.convert_layout(acc, stored)
        r = gl.arange(0, BM, layout=gl.SliceLayout(1, stored))
        c = gl.arange(0, BN, layout=gl.SliceLayout(0, stored))
        last = True
        if SPLIT:
            last = tile < whole
            if tile >= whole:
                cut = tile - whole
                last, y = sum_slices(y, partials + cut.to(gl.int64) * split_k * (BM * BN),
                                     counters + cut, part, split_k,
                                     r[:, None] * BN + c[None, :], BM * BN)
        if last:
            store_out(y, out, bias, pid_m * BM + r, pid_n * BN + c, M, N, stride_om, HAS_BIAS)


@gluon.jit
def gemm_ws_kernel(a_desc, w_desc, out, bias, partials, counters, M, N, K, stride_om,
                   split_k, whole, NUM_PROGRAMS: gl.constexpr, GROUP_M: gl.constexpr,
                   STAGES: gl.constexpr, HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr,
                   CONSUMER_WARPS: gl.constexpr, WARPS_M: gl.constexpr,
                   INSTR_N: gl.constexpr, TPW_N: gl.constexpr):
    """a_desc [M, K] blocks [BM, BK], w_desc [N, K] blocks [BN, BK] (host TensorDescriptors
    with NVMMA shared layouts); out [M, N] (row stride stride_om, last dimension
    contiguous); bias [N] or any pointer (not read without HAS_BIAS). Tiles below `whole`
    run whole; SPLIT: each further tile in split_k (> 1) K slices, with gemm.py's split-K
    workspace (partials fp32 [split tiles * split_k, BM * BN], counters int32 per split
    tile, 0 between launches); else `whole` is every tile, split_k 1, and they are not
    read. Launched with num_warps=CONSUMER_WARPS (the producer's warp on top)."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[0]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BN, BK], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    num_pid_m = gl.cdiv(M, BM)
    num_pid_n = gl.cdiv(N, BN)
    num_units = whole + (num_pid_m * num_pid_n - whole) * split_k
    k_steps = gl.cdiv(K, BK)
    gl.warp_specialize([
        (_consumer, (out, bias, partials, counters, a_bufs, w_bufs, ready, empty, num_units,
                     whole, num_pid_m, num_pid_n, k_steps, split_k, M, N, stride_om, BM, BN,
                     GROUP_M, NUM_PROGRAMS, STAGES, HAS_BIAS, SPLIT, CONSUMER_WARPS,
                     WARPS_M, INSTR_N, TPW_N)),
        (_producer, (a_desc, w_desc, a_bufs, w_bufs, ready, empty, num_units, whole, num_pid_m,
                     num_pid_n, k_steps, split_k, GROUP_M, NUM_PROGRAMS, STAGES)),
    ], [1], [40])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))


def descriptors(a, w, cfg: dict):
    """Host TensorDescriptors of a [M, K] and w [N, K] for a launch of `cfg` (blocks [BM,
    BK] and [BN, BK], NVMMA shared layouts)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    dt = GL_DTYPES[a.dtype]
    return tuple(TensorDescriptor(t, list(t.shape), [t.stride(0), 1], block,
                                  gl.NVMMASharedLayout.get_default_for(block, dt))
                 for t, block in ((a, [bm, bk]), (w, [bn, bk])))


def launch_args(a, w, bias, out, cfg: dict, sms: int, split: int = 1):
    """(grid, args, kwargs) of one launch for checked, TMA-compatible tensors (out's
    position in args: 2), `split` K slices per tile (gemm.split_k_for's choice): of every
    tile, or for a TAIL config of the tiles past the full waves of `sms` programs."""
    M, K = a.shape
    N = w.shape[0]
    tiles = triton.cdiv(M, cfg["BM"]) * triton.cdiv(N, cfg["BN"])
    whole = tiles if split == 1 else (tiles // sms * sms if cfg.get("TAIL") else 0)
    programs = min(whole + (tiles - whole) * split, sms)
    if split > 1:
        cut = max(tiles - whole, 1)
        partials, counters = split_workspace(a.device, cut * split * cfg["BM"] * cfg["BN"], cut)
    else:
        partials = counters = a                 # not read
    warps_m, instr_n = wgmma_shape(cfg["BM"], cfg["BN"], cfg["num_warps"])
    kwargs = dict(NUM_PROGRAMS=programs, GROUP_M=cfg["GROUP_M"], STAGES=cfg["num_stages"],
                  HAS_BIAS=bias is not None, SPLIT=split > 1, CONSUMER_WARPS=cfg["num_warps"],
                  WARPS_M=warps_m, INSTR_N=instr_n, TPW_N=min(32, cfg["BN"] // 8),
                  num_warps=cfg["num_warps"])
    return (programs,), (*descriptors(a, w, cfg), out, bias if bias is not None else a,
                         partials, counters, M, N, K, out.stride(0), split, whole), kwargs
