"""The GEMM core's configurations (trident/ops/gemm.py): the candidates that `python -m
trident.bench.gemm` times per shape class and whose names gemm_table.json holds, and how
many K slices a split-K launch uses (`split_k_for`). Pure Python: no kernel here.

A config: BM x BN output tiles (of out.T with SWAP_AB: BM tiles N, BN tiles M), BK per
step, GROUP_M row blocks per group, num_stages of TMA pipeline, num_warps, SPLIT_K (at
most this many K slices; 1: none), SWAP_AB, WARP_SPECIALIZE (no candidate: see below),
STREAM_K (stream-K over one wave of programs where the tiles leave SMs idle:
`stream_k_for`; named <base candidate>_streamk).
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
            split_k: int = 1, swap_ab: bool = False, stream_k: bool = False) -> dict:
    cfg = dict(BM=bm, BN=bn, BK=bk, GROUP_M=8, num_stages=stages, num_warps=warps,
               WARP_SPECIALIZE=ws, SPLIT_K=split_k, SWAP_AB=swap_ab)
    if stream_k:                       # only these carry the key (table files stay as they are)
        cfg["STREAM_K"] = True
    return cfg


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
    # Mid M (64..1024), issue 40: M=256 in one row block (w read once, whatever L2
    # does): 8 warps, 128 fp32 accumulators a thread as 128x256; 3 stages of 48 KB (w:
    # 16 KB a stage), the shared memory of 128x256x64_s3_w8. N=14336 is 112 such tiles.
    # On one H200 it won m1024-n4096-k4096 (docs/history.md, "The GEMM core at mid M").
    "256x128x64_s3_w8": _config(256, 128, 64, 3, 8),
}

# Stream-K (STREAM_K; stream_k_for, and the kernel's stream-K branch in gemm.py), not
# tried by default. What the candidates above lose to cuBLAS at mid M is mostly the last
# wave: M=128, N=14336 is 112 tiles of 128x128 on 132 SMs (15% of the SMs idle while w
# streams from HBM); M=1024, N=14336 is 448 tiles of 128x256, 3.4 waves run as 4.
# Stream-K gives every one of the P programs the same share of the last one-to-two waves'
# BK-steps, across tile boundaries; partial tiles are summed by the last to arrive, in
# program order (deterministic, counters rearmed: split-K's protocol). Where the last
# wave is >= 90% full they run their base candidate's kernel. Shared memory: as their
# base candidates. On one H200 each lost to its base candidate wherever it ran (1.1-1.5x
# slower; docs/history.md, "The GEMM core at mid M"): like split-K with several units a
# program (split_for_tiles' note), a program that takes several pieces runs slower, cause
# not known yet. So `bench gemm` tries them only when named (--candidates), which also
# keeps their minutes of sm_90 compile out of the test suite; resolve() and the tables
# accept their names. Tiles: the plain winners at M=128..1024 (128x128x64, 128x256x64,
# 128x64x64), M=256 in one row block (256x128x64), and for M=64 (N=4096 is only 16 or
# 32 tiles, which stream-K spreads over all SMs; split-K stops at 8 slices) 64x256x64
# and swap-AB's 128 rows of N x 64 columns of M.
STREAM_K_CANDIDATES = {
    "128x128x64_s4_w8_streamk": _config(128, 128, 64, 4, 8, stream_k=True),
    "128x256x64_s3_w8_streamk": _config(128, 256, 64, 3, 8, stream_k=True),
    "128x64x64_s6_w4_streamk": _config(128, 64, 64, 6, 4, stream_k=True),
    "256x128x64_s3_w8_streamk": _config(256, 128, 64, 3, 8, stream_k=True),
    "64x256x64_s4_w4_streamk": _config(64, 256, 64, 4, 4, stream_k=True),
    "swab128x64x64_s6_w4_streamk": _config(128, 64, 64, 6, 4, swap_ab=True, stream_k=True),
}
# Deeper pipelines and longer K steps at mid M (issue 40). cuBLAS's kernels there run
# 128x64 and 64x64 tiles with 8-13 stages and 128x128 with 6 (ncu on one H200:
# docs/history.md, "The GEMM core at mid M: what ncu shows"), where the candidates above
# have 3-6; with these, gemm.py's kernel takes several mid-M classes of the H200 table.
# Shared memory: stages * (BM + BN) * BK * 2 bytes plus the epilogue's BM * BN * 2, all
# under sm_90's 227 KB (128x128x64_s6_w8: 224 KB).
DEEP_CANDIDATES = {
    "128x128x64_s5_w8": _config(128, 128, 64, 5, 8),
    "128x128x64_s6_w8": _config(128, 128, 64, 6, 8),
    "128x64x64_s8_w4_sk8": _config(128, 64, 64, 8, 4, split_k=8),
    "128x64x128_s4_w4_sk8": _config(128, 64, 128, 4, 4, split_k=8),
    "64x64x128_s6_w4_sk8": _config(64, 64, 128, 6, 4, split_k=8),
    "64x128x128_s4_w4": _config(64, 128, 128, 4, 4),
    "swab64x64x128_s6_w4_sk8": _config(64, 64, 128, 6, 4, split_k=8, swap_ab=True),
}


def _ws(bm: int, bn: int, bk: int, stages: int, warps: int, twin: str,
        split_k: int = 1, tail: bool = False) -> dict:
    """A config of the warp-specialised Gluon kernel (trident/ops/gemm_ws.py: GLUON):
    `warps` consumer warps, one producer warp on top, `stages` TMA slots. TWIN: the
    candidate of gemm.py's kernel that runs instead where this one cannot (the CPU
    emulation, a GPU other than sm_90, tensors TMA cannot take, in-kernel descriptors,
    the fused kernels). TAIL: split only the last wave's tiles (split_k_for), at most
    split_k slices each."""
    cfg = dict(_config(bm, bn, bk, stages, warps, split_k=split_k), GLUON=True, TWIN=twin)
    if tail:                           # only these carry the key (table files stay as they are)
        cfg["TAIL"] = True
    return cfg


# The warp-specialised Gluon kernel (gemm_ws.py); it takes several classes of the H200
# table, mid M mostly. Shared memory: stages * (BM + BN) * BK * 2 bytes plus the
# epilogue's layout conversion (at most BM * BN * 2), under sm_90's 227 KB
# (tests/compile/sm90.py).
WS_CANDIDATES = {
    "ws128x128x64_s6_w8": _ws(128, 128, 64, 6, 8, "128x128x64_s4_w8"),
    "ws128x128x64_s6_w4": _ws(128, 128, 64, 6, 4, "128x128x64_s4_w8"),
    "ws128x128x128_s3_w8": _ws(128, 128, 128, 3, 8, "128x128x128_s3_w8"),
    "ws128x256x64_s4_w8": _ws(128, 256, 64, 4, 8, "128x256x64_s3_w8"),
    "ws128x64x64_s8_w4": _ws(128, 64, 64, 8, 4, "128x64x64_s6_w4_sk8"),
    "ws64x128x128_s4_w4": _ws(64, 128, 128, 4, 4, "64x128x64_s4_w4"),
    "ws64x64x128_s6_w4": _ws(64, 64, 128, 6, 4, "64x128x64_s4_w4"),
    "ws64x256x64_s4_w4": _ws(64, 256, 64, 4, 4, "64x256x64_s4_w4"),
    # split-K (split_k_for: one wave of work units) for the shapes of too few tiles
    "ws64x64x128_s6_w4_sk8": _ws(64, 64, 128, 6, 4, "64x64x128_s6_w4_sk8", split_k=8),
    "ws128x128x64_s6_w8_sk4": _ws(128, 128, 64, 6, 8, "128x128x64_s4_w8_sk8", split_k=4),
    "ws128x64x64_s8_w4_sk4": _ws(128, 64, 64, 8, 4, "128x64x64_s6_w4_sk8", split_k=4),
    "ws64x128x128_s4_w4_sk4": _ws(64, 128, 128, 4, 4, "64x128x64_s4_w4_sk8", split_k=4),
    # more stages and two consumer warp groups on 64-column tiles
    "ws128x128x64_s5_w8": _ws(128, 128, 64, 5, 8, "128x128x64_s4_w8"),
    "ws128x64x64_s8_w8": _ws(128, 64, 64, 8, 8, "128x64x64_s6_w4_sk8"),
    # the last wave split in K (split_k_for), for shapes whose tiles fill a few waves and a
    # part of one (N = 5120: 2.4 waves of 128x128 tiles at M = 1024, 1.2 of 64x128 at 256)
    "ws128x128x64_s6_w8_tail4": _ws(128, 128, 64, 6, 8, "128x128x64_s4_w8", 4, tail=True),
    "ws128x256x64_s4_w8_tail4": _ws(128, 256, 64, 4, 8, "128x256x64_s3_w8", 4, tail=True),
    "ws128x64x64_s8_w4_tail4": _ws(128, 64, 64, 8, 4, "128x64x64_s6_w4_sk8", 4, tail=True),
    "ws64x128x128_s4_w4_tail4": _ws(64, 128, 128, 4, 4, "64x128x64_s4_w4", 4, tail=True),
    "ws64x64x128_s6_w4_tail4": _ws(64, 64, 128, 6, 4, "64x128x64_s4_w4", 4, tail=True),
}
# what `python -m trident.bench.gemm` (and `trident tune --gemm`) times by default: all
# but stream-K, which lost wherever it ran (docs/history.md)
SWEPT = {**CANDIDATES, **DEEP_CANDIDATES, **WS_CANDIDATES}
KNOWN = {**SWEPT, **STREAM_K_CANDIDATES}     # every name a config may go by

# Stream-K: at least this many BK-steps a program (fewer programs than SMs on small
# problems): a pipeline of 3-6 stages has to fill before it streams.
STREAM_K_MIN_STEPS = 8


def base_candidate(name: str) -> str | None:
    """The candidate a split-K or stream-K one is built on ("128x128x64_s4_w8_sk8" and
    "128x128x64_s4_w8_streamk" -> "128x128x64_s4_w8"), None for one without either (or
    whose base is no candidate): where split_k_for gives 1 slice (stream_k_for 0
    programs), both run one kernel."""
    if name.endswith("_streamk"):
        head = name[:-len("_streamk")]
        return head if head in KNOWN else None
    for mark in ("_sk", "_tail"):
        head, sep, tail = name.rpartition(mark)
        if sep and tail.isdigit():
            return head if head in KNOWN else None
    return None


def stream_k_tiles(tiles: int, programs: int) -> int:
    """The tiles of a stream-K launch of `programs` programs that run data-parallel (one
    program each, whole K): all but the last one-to-two waves' worth, so that the stream-K
    share is `programs` to 2 * `programs` tiles (or all tiles, when fewer). The kernel's
    stream-K branch (gemm.py) computes the same."""
    return max(tiles // programs - 1, 0) * programs


def stream_k_for(M: int, N: int, K: int, cfg: dict, sms: int) -> int:
    """Programs of a stream-K launch of `cfg` (STREAM_K) on `sms` SMs, 0 for the plain
    kernel (no STREAM_K, or the last wave of tiles is >= 90% full, or stream-K's cost is
    not 5% under it). Cost in full-tile times: plain ceil(tiles / sms) waves; stream-K
    tiles / P, plus the fix-up of a stream-K tile (each slice's fp32 partial written and
    read once, against the tile's operand bytes, as split_for_tiles counts it) times the
    programs a stream-K tile is shared by. P: the SMs, or fewer where a program would get
    under STREAM_K_MIN_STEPS BK-steps."""
    if not cfg.get("STREAM_K"):
        return 0
    rows, cols = (N, M) if cfg.get("SWAP_AB") else (M, N)
    tiles = triton.cdiv(rows, cfg["BM"]) * triton.cdiv(cols, cfg["BN"])
    steps = triton.cdiv(K, cfg["BK"])
    waves = triton.cdiv(tiles, sms)
    if tiles >= 0.9 * waves * sms:
        return 0
    programs = sms
    while programs > 1:
        sk_tiles = tiles - stream_k_tiles(tiles, programs)
        if sk_tiles * steps >= programs * STREAM_K_MIN_STEPS:
            break
        programs -= 1
    if programs <= 1:
        return 0
    sk_tiles = tiles - stream_k_tiles(tiles, programs)
    partial = cfg["BM"] * cfg["BN"] * 4 / (K * (cfg["BM"] + cfg["BN"]) * 2)
    shared_by = programs / sk_tiles + 1
    cost = tiles / programs + shared_by * partial
    return programs if cost < 0.95 * waves else 0


def split_k_for(M: int, N: int, K: int, cfg: dict, sms: int) -> int:
    """How many K slices a launch of `cfg` uses (split_for_tiles over its output tiles;
    a swap-AB config tiles N with BM and M with BN). A TAIL config (gemm_ws.py) runs the
    tiles of its full waves whole and splits only those of the partial last wave, so its
    slices are split_for_tiles's over those (fewer than `sms` tiles: at most one unit a
    program there)."""
    rows, cols = (N, M) if cfg.get("SWAP_AB") else (M, N)
    tiles = triton.cdiv(rows, cfg["BM"]) * triton.cdiv(cols, cfg["BN"])
    if cfg.get("TAIL"):
        tiles %= sms
        if not tiles:                   # full waves only: nothing to split
            return 1
    return split_for_tiles(tiles, K, cfg, sms)


def split_for_tiles(tiles: int, K: int, cfg: dict, sms: int) -> int:
    """K slices per tile for a launch of `tiles` output tiles of `cfg` on `sms` SMs (the
    fused ops count their own tiles: trident/ops/fused_tile.py): 1 without SPLIT_K or when
    the tiles alone fill the SMs; else the s <= SPLIT_K with tiles * s <= sms work units
    (one wave: each program takes one unit) and at least 2 BK-steps a slice, of least cost
    1 / s (the wave, in full-tile time) + s * partial / operands (a slice's fp32 partial
    against the tile's operand bytes: the workspace traffic), taken only if 5% under one
    slice's cost.
    Why one wave: on one H200 (M = 64) split-K launches of gemm.py's kernel whose
    programs took several units each ran 2-3x slower than the kernel with one slice (its
    pipeline refills per unit), while those of one unit a program matched cuBLAS
    (figures: docs/history.md, "Notes moved out of the source"). The Gluon kernel, whose
    producer warp feeds across units, lost with two units a program too (docs/history.md,
    "The GEMM core: two work units a program")."""
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
