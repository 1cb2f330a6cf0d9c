"""The GEMM core's configurations (trident/ops/gemm.py): the candidates that `python -m
trident.bench.gemm` times per shape class and whose names gemm_table.json holds, and how
many K slices a split-K launch uses (`split_k_for`). Pure Python: no kernel here.

A config: BM x BN output tiles (of out.T with SWAP_AB: BM tiles N, BN tiles M), BK per
step, GROUP_M row blocks per group, num_stages of TMA pipeline, num_warps, SPLIT_K (at
most this many K slices; 1: none), SWAP_AB, WARP_SPECIALIZE (no candidate: see below).
"""
from __future__ import annotations

import triton

# Candidates the benchmark tries for every shape class (names are table values).
# Shared memory per stage is (BM + BN) * BK * 2 bytes, plus a BM x BN output tile.
#
# No warp-specialised candidate (WARP_SPECIALIZE=True): triton 3.6's sm_90 warp
# specialisation (the "hopper warpspec" pass, NVGPUWarpSpecialization) cannot serve this
# kernel, so the two such candidates are dropped (issue 21). What the compiled kernels
# show (TTGIR/PTX for sm_90, num_warps=4, num_stages=4):
# - 128x128x64_s4_w4_ws hangs with host-side descriptors (the default since host
#   descriptors came in). The pass runs the 128-row tile as two consumer warp groups of
#   64 rows (12 warps in all) and splits the load of a into two [64, 64] TMA copies, each
#   into a 64x64 buffer with an mbarrier expecting 8192 bytes. It can re-block a
#   descriptor made in the kernel (tensormap_create gets box [64, 64]), but not one made
#   on the host: both copies go through the host's CUtensorMap with box [128, 64] and
#   deliver 16384 bytes each: the barriers' byte counts no longer balance, and the
#   consumers wait on them for ever (GPU busy, host in the sync after the launch),
#   while each copy writes 8 KB past its buffer. Later triton rejects this at compile
#   time ("descriptor block and tensor must have the same number of elements",
#   triton-lang/triton#11587); 3.6 compiles it silently. It is triton's bug, met by our
#   switch to host descriptors: with in-kernel descriptors the same config ran right
#   but lost to a plain candidate in every shape class (figures: docs/history.md, "Notes moved out of the source").
# - 64x128x64_s4_w4_ws does not hang (its copies match the descriptors' blocks) but
#   both consumer warp groups compute the same whole 64x128 tile and both store it:
#   twice the wgmma work, and about half cuBLAS's speed.
# So launch_args takes warp specialisation with in-kernel descriptors only (a config
# that asks for it gets them by default, and desc="host" is refused), and the
# candidates below are the plain pipelined kernel. (64x256 with warp specialisation
# also trips an assertion in triton 3.6's sm_90 backend.)
def _config(bm: int, bn: int, bk: int, stages: int, warps: int, ws: bool = False,
            split_k: int = 1, swap_ab: bool = False) -> dict:
    return dict(BM=bm, BN=bn, BK=bk, GROUP_M=8, num_stages=stages, num_warps=warps,
                WARP_SPECIALIZE=ws, SPLIT_K=split_k, SWAP_AB=swap_ab)


CANDIDATES = {
    "128x256x64_s3_w8": _config(128, 256, 64, 3, 8),
    "128x128x64_s4_w8": _config(128, 128, 64, 4, 8),
    "128x128x128_s3_w8": _config(128, 128, 128, 3, 8),
    "64x128x64_s4_w4": _config(64, 128, 64, 4, 4),
    "64x256x64_s4_w4": _config(64, 256, 64, 4, 4),
    # split-K (at most SPLIT_K slices; split_k_for picks how many per shape, 1 when the
    # output tiles fill the GPU): for small M. Named <base candidate>_sk<SPLIT_K>.
    "128x128x64_s4_w8_sk8": _config(128, 128, 64, 4, 8, split_k=8),
    "64x128x64_s4_w4_sk8": _config(64, 128, 64, 4, 4, split_k=8),
    "128x256x64_s3_w8_sk8": _config(128, 256, 64, 3, 8, split_k=8),
    "64x256x64_s4_w4_sk4": _config(64, 256, 64, 4, 4, split_k=4),
    # Small M (decode), where reading w is the floor. One warp group's wgmma is 64 rows
    # of the tile, so a BM=64 tile at M=1..63 wastes most of it; swap-AB (SWAP_AB:
    # out.T = w @ a.T, named swab<BM>x<BN>x<BK>..., BM tiling N and BN tiling M) puts N
    # in the MMA's rows and M in its 16-64 columns, as cuBLAS and TRT-LLM do for
    # decode. With split-K (few tiles at small M: M=64, N=8192 is 64 tiles of 128 rows
    # against 132 SMs) and deep TMA pipelines of w (4-6 stages, 16-32 KB each) every SM
    # keeps enough of w in flight to stream it at the HBM rate. Shared memory: stages *
    # (BM + BN) * BK * 2 bytes, plus the epilogue's layout conversion of the fp32 tile
    # (BM * BN * 4): under the 227 KB of an sm_90 block (tests/compile/sm90.py checks).
    "swab128x64x64_s6_w4_sk8": _config(128, 64, 64, 6, 4, split_k=8, swap_ab=True),
    "swab128x32x128_s4_w4_sk8": _config(128, 32, 128, 4, 4, split_k=8, swap_ab=True),
    "swab64x64x128_s4_w4_sk8": _config(64, 64, 128, 4, 4, split_k=8, swap_ab=True),
    # M <= 32 (decode at batch 1-32): N in 64- or 128-row MMA tiles, M in 16 or 32
    # columns (wgmma's smallest useful N), BK 128 and 5-6 stages of w in flight (48-96 KB
    # per SM), split-K up to 16 slices so that the one wave of work units fills the SMs
    # (split_for_tiles). (A non-swapped tile of 16 rows would take mma.sync: wgmma needs
    # 64; swap-AB's 16 columns are the same tile on wgmma.)
    "swab128x16x128_s5_w4_sk16": _config(128, 16, 128, 5, 4, split_k=16, swap_ab=True),
    "swab64x16x128_s6_w4_sk16": _config(64, 16, 128, 6, 4, split_k=16, swap_ab=True),
    "swab64x32x128_s5_w4_sk16": _config(64, 32, 128, 5, 4, split_k=16, swap_ab=True),
    "swab64x64x128_s4_w4_sk16": _config(64, 64, 128, 4, 4, split_k=16, swap_ab=True),
    # M=128 in one row block of 128, N in blocks of 64 (twice the tiles of 128x128)
    "128x64x64_s6_w4_sk8": _config(128, 64, 64, 6, 4, split_k=8),
}


def base_candidate(name: str) -> str | None:
    """The candidate a split-K one is built on ("128x128x64_s4_w8_sk8" -> "128x128x64_s4_w8"),
    None for one without split-K: where split_k_for gives 1 slice, both run one kernel."""
    head, sep, tail = name.rpartition("_sk")
    return head if sep and tail.isdigit() and head in CANDIDATES else None


def split_k_for(M: int, N: int, K: int, cfg: dict, sms: int) -> int:
    """How many K slices a launch of `cfg` uses (split_for_tiles over its output tiles;
    a swap-AB config tiles N with BM and M with BN)."""
    rows, cols = (N, M) if cfg.get("SWAP_AB") else (M, N)
    return split_for_tiles(triton.cdiv(rows, cfg["BM"]) * triton.cdiv(cols, cfg["BN"]), K,
                           cfg, sms)


def split_for_tiles(tiles: int, K: int, cfg: dict, sms: int) -> int:
    """K slices per tile for a launch of `tiles` output tiles of `cfg` on `sms` SMs (the
    fused ops count their own tiles: trident/ops/fused_tile.py): 1 without SPLIT_K or when
    the tiles alone fill the SMs; else the s <= SPLIT_K with tiles * s <= sms work units
    (one wave: each program takes one unit) and at least 2 BK-steps a slice, of least cost
    1 / s (the wave, in full-tile time) + s * partial / operands (a slice's fp32 partial
    against the tile's operand bytes: the workspace traffic), taken only if 5% under one
    slice's cost.
    Why one wave: on one H200 (M = 64) split-K launches whose programs took several units
    each ran 2-3x slower than the kernel with one slice, while those of one unit a program
    matched cuBLAS (figures: docs/history.md, "Notes moved out of the source"). Cause not known."""
    most = int(cfg.get("SPLIT_K", 1))
    if most <= 1 or tiles >= sms:
        return 1
    most = min(most, triton.cdiv(K, cfg["BK"]) // 2, sms // tiles)
    if most <= 1:                  # K too short for two slices of two BK-steps each
        return 1
    partial = cfg["BM"] * cfg["BN"] * 4 / (K * (cfg["BM"] + cfg["BN"]) * 2)
    cost = {s: triton.cdiv(tiles * s, sms) / s + (s * partial if s > 1 else 0.0)
            for s in range(1, most + 1)}
    best = min(cost, key=lambda s: (cost[s], s))
    return best if cost[best] < 0.95 * cost[1] else 1
