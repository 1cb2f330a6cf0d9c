"""The GEMM side of the fused ops (all_gather_matmul, matmul_reduce_scatter,
matmul_all_reduce): which core and tiles a launch uses, and the tile those kernels compute,
with the GEMM core's small-M tools -- swap-AB and deterministic split-K (trident/ops/gemm.py).

Tiles. A fused kernel's tile is always a [BM, BN] block of out (BM rows of M, BN columns of
N): the unit its communication moves, flags and owns (slots, row blocks, owners). With a
swap-AB config the MMA runs on (w @ a.T), N in its rows and the few rows of a in its
16-64 columns, as the core does for decode; `op_tile` transposes the result in registers,
so the communication sees an ordinary tile of out. tile_shape turns a core config (whose
BM tiles N when swapped) into the op's (BM, BN).

Split-K. A tile's K steps are cut into `split` slices, each a work unit of its own (units
u = tile * split + slice, neighbours run together). Each slice stores its fp32 partial in
the op workspace's split-K buffers (split_buffers: this rank's own, not on the heap, made
outside CUDA-graph pools) and counts itself in the tile's counter;
the last one to arrive sums the partials in slice order (deterministic) and only then
does what the kernel does with a finished tile -- push it to its owner and set the flag
(row-parallel ops) or add the bias and store it (all_gather_matmul). So a flag or an
output never covers a tile with a slice missing, and no second pass is needed. The slice
count is each rank's own (its K, and the op's tile count): the exchanged tiles do not
depend on it.

When "auto" takes which core: see fused_gemm_config.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import GEMM_MODES, TMA_MIN_M, gemm_config
from .gemm import dot_slice, dot_tile
from ..trace import device as trd, tags

ANY = 1 << 30              # a size above every edge of the GEMM table: its largest bucket


def fused_gemm_config(ctx, M: int, N: int, K: int, gemm: str | None, config: dict | None,
                      group_m: int, local: str, gluon: bool = False) -> dict:
    """The GEMM side of a fused launch: a core config (BM, BN, BK, GROUP_M, num_warps,
    num_stages, SWAP_AB, SPLIT_K: the most slices), PERSISTENT (True on the "tma" and
    "gluon" cores) and CORE (the core it runs: "classic", "tma" or "gluon").
    gemm: "auto", "classic", "tma" or "gluon" (None: ctx.options.gemm, TRIDENT_GEMM);
    config: overrides (an option of the call); group_m: the classic core's GROUP_M.
    "auto": "tma" from TMA_MIN_M rows, and below it where the table's entry is a small-M
    one (swap-AB or split-K: the core's decode choice); "classic" otherwise; never "gluon".
    "gluon": only for an op that has that core (`gluon`: all three fused ops pass it) and where it
    can run (gluon_runs: an sm_90 GPU; all_gather_matmul also K % 8 == 0); "tma"
    elsewhere, the CPU emulation included. Its tiles: gluon_tiles; a per-rank fallback to
    the "tma" kernel (a w, or for the row-parallel ops an a, that TMA cannot address)
    takes FALLBACK, a Triton config of the same BM (all_gather_matmul: the row block every
    rank flags) and, row-parallel, the same BN and GROUP_M (the tiles, their order and so
    the slots every rank exchanges).
    local: the size that may differ between ranks ("N" of all_gather_matmul, "K" of the
    row-parallel ops): the table is read at its largest bucket of that size instead, so
    that every rank takes the same tiles (they decide the slots, flags and row blocks the
    ranks exchange); the split count still follows the rank's own size (split_count)."""
    mode = ctx.options.gemm if gemm is None else gemm
    if mode not in GEMM_MODES:
        raise ValueError(f"the fused ops' GEMM core must be one of {GEMM_MODES} (env "
                         f"TRIDENT_GEMM or the gemm= option), got {mode!r}")
    if local not in ("N", "K"):
        raise ValueError(f"fused_gemm_config: local must be 'N' or 'K', got {local!r}")
    if mode == "gluon" and gluon and (config or {}).get("SWAP_AB"):
        raise ValueError("the fused ops' gluon GEMM core runs no swap-AB config (SWAP_AB); "
                         "ask for gemm='tma' to run one")
    if mode == "gluon" and not (gluon and gluon_runs(ctx, K if local == "N" else None)):
        mode = "tma"
    table_cfg = None
    if mode != "classic":
        from . import gemm as core
        n_table, k_table = (ANY, K) if local == "N" else (N, ANY)
        entry = core.config_for(M, n_table, k_table, split_k=True)
        # a Gluon entry (gemm_ws.py, the standalone GEMM's): the Triton kernels run its twin
        table_cfg = gluon_tiles(M, n_table, k_table, entry) if mode == "gluon" \
            else core.triton_config(entry)
    if mode == "auto":
        small = table_cfg["SWAP_AB"] or table_cfg["SPLIT_K"] > 1
        mode = "tma" if M >= TMA_MIN_M or small else "classic"
    if mode == "classic":
        cfg = dict(GROUP_M=group_m, SPLIT_K=1, SWAP_AB=False, **gemm_config(ctx, M, N, K))
    else:
        cfg = table_cfg
    cfg.update(config or {})
    for key in ("WARP_SPECIALIZE", "STREAM_K", "GLUON", "TWIN", "TAIL"):
        cfg.pop(key, None)             # the fused ops run a stream-K config's tiles plainly
    cfg["SWAP_AB"] = bool(cfg.get("SWAP_AB", False))
    cfg["SPLIT_K"] = int(cfg.get("SPLIT_K", 1))
    cfg["PERSISTENT"] = mode != "classic"
    cfg["CORE"] = mode
    if mode == "gluon":
        if cfg["BM"] % 64 or cfg["num_warps"] not in (4, 8) or cfg["BN"] % 8:
            raise ValueError(f"the fused ops' gluon GEMM core needs BM a multiple of 64 "
                             f"(wgmma's 64 rows a warp group), BN a multiple of 8 and 4 or 8 "
                             f"consumer warps; got BM={cfg['BM']}, BN={cfg['BN']}, "
                             f"num_warps={cfg['num_warps']}")
        same = dict(BM=cfg["BM"]) if local == "N" else \
            dict(BM=cfg["BM"], BN=cfg["BN"], GROUP_M=cfg["GROUP_M"])
        fallback = dict(cfg["FALLBACK"], **same, SWAP_AB=False, PERSISTENT=True, CORE="tma")
        for key in ("WARP_SPECIALIZE", "STREAM_K", "GLUON", "TWIN", "TAIL"):
            fallback.pop(key, None)
        cfg["FALLBACK"] = fallback
    return cfg


def gluon_runs(ctx, K: int | None) -> bool:
    """Whether the gluon core (fused_gluon.py, matmul_reduce_gluon.py) can run on this
    context: an sm_90 GPU (not the CPU emulation) and, K given (all_gather_matmul's, the
    same on every rank), 16-byte rows of the gathered buffer (K % 8 == 0). What is each
    rank's own -- a w (or, row-parallel, an a: None here, K is each rank's shard) that
    TMA cannot address -- makes that rank run FALLBACK (fused_gemm_config)."""
    from . import gemm as core
    from ..runtime._env import INTERPRET
    return (not INTERPRET and ctx.backend == "cuda" and (K is None or K % 8 == 0)
            and core.gpu_identity(ctx.device)[1] == (9, 0))


def gluon_tiles(M: int, N: int, K: int, entry: dict) -> dict:
    """The gluon core's config for the GEMM table entry of (M, N, K) (the sizes the table
    was read at): a Gluon entry (gemm_ws.py) as it is, with its TWIN as FALLBACK; a
    swap-AB one by the plain config the fused kernels take for it (gemm.config_for
    without split_k); any other as it is (its own FALLBACK)."""
    from . import gemm as core
    if entry.get("GLUON"):
        cfg = dict(entry)
        cfg["FALLBACK"] = core.resolve(entry["TWIN"])
    else:
        cfg = core.config_for(M, N, K) if entry["SWAP_AB"] else dict(entry)
        cfg["FALLBACK"] = dict(cfg)
    return cfg


def gemm_programs(ctx, cfg: dict, num_units: int, tma: bool) -> int:
    """How many GEMM programs a fused launch starts: one per work unit (a tile, or a
    split-K slice of one) on the classic core, one per SM at most (persistent). Sets up
    Triton's allocator for in-kernel TMA descriptors."""
    if not cfg["PERSISTENT"]:
        return num_units
    from . import gemm as core
    if tma and ctx.backend == "cuda":
        core.ensure_allocator()
    return max(1, min(num_units, core.num_sms(ctx.device)))


def num_tiles(op: str, M: int, N: int, world: int, cfg: dict) -> int:
    """How many tiles of out a fused op's GEMM computes (M: the GEMM's rows, all ranks'
    for all_gather_matmul): matmul_reduce_scatter tiles each owner's M / world rows apart."""
    bm, bn = tile_shape(cfg)
    row_blocks = world * triton.cdiv(M // world, bm) if op == "matmul_reduce_scatter" \
        else triton.cdiv(M, bm)
    return row_blocks * triton.cdiv(N, bn)


def choice(ctx, op: str, M: int, N: int, K: int, gemm: str | None = None,
           config: dict | None = None, split_k: int | None = None) -> str:
    """What this rank's fused kernel of `op` runs at this size, in a few words (for the
    benchmark's tables): the core, swap-AB, the tile of out, the K slices."""
    cfg = fused_gemm_config(ctx, M, N, K, gemm, config, 8,
                            "N" if op == "all_gather_matmul" else "K", gluon=True)
    split = split_count(ctx, cfg, num_tiles(op, M, N, ctx.world_size, cfg), K, split_k)
    bm, bn = tile_shape(cfg)
    return (f"{cfg['CORE']}{' swab' if cfg['SWAP_AB'] else ''} "
            f"{bm}x{bn}x{cfg['BK']}" + (f" split {split}" if split > 1 else ""))


def tile_shape(cfg: dict) -> tuple[int, int]:
    """(rows of M, columns of N) of the op's tile: a swap-AB config's BM tiles N."""
    return (cfg["BN"], cfg["BM"]) if cfg["SWAP_AB"] else (cfg["BM"], cfg["BN"])


def split_count(ctx, cfg: dict, num_tiles: int, K: int, split_k: int | None = None) -> int:
    """K slices per tile of a fused launch over num_tiles tiles of tile_shape(cfg).
    split_k: exactly this many (an option of the call, as gemm.matmul's); default
    gemm.split_for_tiles's choice for the config's SPLIT_K, the tiles and this rank's K."""
    from . import gemm as core
    if split_k is None:
        split = core.split_for_tiles(num_tiles, K, cfg, core.num_sms(ctx.device))
    elif isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 1:
        raise ValueError(f"the fused ops' split_k must be a positive int, got {split_k!r}")
    else:
        split = split_k
    bm, bn = tile_shape(cfg)
    if split > 1 and num_tiles * split * bm * bn >= 2 ** 31:
        raise ValueError(f"split_k={split} over {num_tiles} tiles of {bm}x{bn} needs more "
                         f"than 2**31 partial elements; use fewer slices")
    return split


def split_buffers(ws, op: str, cfg: dict, num_tiles: int, split: int):
    """(fp32 partials, int32 counters) of a fused launch of `op` with `split` slices per
    tile (split_count) on its workspace `ws` (_common.Workspace). With split-K, the
    workspace's (Workspace.split_buffers: made once per size, outside CUDA-graph pools);
    without, views of its heap memory that the kernel does not read -- so a call
    allocates nothing but its output, and a plan keeps nothing else a call allocated."""
    if split == 1:
        return ws.data[:4].view(torch.float32), ws.sync
    bm, bn = tile_shape(cfg)
    return ws.split_buffers(op, num_tiles * split * bm * bn, num_tiles)


@triton.jit
def op_tile(a, stride_am, w, stride_wn, m0, n0, M, N, K, s, split_k, BM: tl.constexpr,
            BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr, TMA: tl.constexpr,
            SWAP_AB: tl.constexpr, SPLIT: tl.constexpr):
    """fp32 [BM, BN] tile of out = a @ w.T at (m0, n0), a and w from gemm.operand (blocks
    [BM, BK] and [BN, BK] either way) -- with SPLIT, only slice s of split_k of its K
    steps (finish the tile with _common.finish_slice). SWAP_AB: the MMA computes the
    [BN, BM] tile of w @ a.T (N in its rows), transposed here."""
    if SPLIT:
        steps = tl.cdiv(K, BK)
        lo = s * steps // split_k
        hi = (s + 1) * steps // split_k
        if SWAP_AB:
            acc = tl.trans(dot_slice(w, stride_wn, a, stride_am, n0, m0, N, M, K, lo, hi,
                                     BN, BM, BK, TMA))
        else:
            acc = dot_slice(a, stride_am, w, stride_wn, m0, n0, M, N, K, lo, hi, BM, BN, BK,
                            TMA)
    else:
        if SWAP_AB:
            acc = tl.trans(dot_tile(w, stride_wn, a, stride_am, n0, m0, N, M, K, BN, BM, BK,
                                    EVEN_K, TMA))
        else:
            acc = dot_tile(a, stride_am, w, stride_wn, m0, n0, M, N, K, BM, BN, BK, EVEN_K,
                           TMA)
    return acc


@triton.jit
def unit_partial(u, num_nb, a, stride_am, w, stride_wn, M, N, K, trace_buf, rank,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
                 TMA: tl.constexpr, SWAP_AB: tl.constexpr, TRACE: tl.constexpr):
    """Unit u's corner (m0, n0) and this rank's fp32 partial [BM, BN] of it (traced as a
    GEMM tile): the row-parallel kernels' first step, whatever their exchange."""
    m0 = (u // num_nb) * BM
    n0 = (u % num_nb) * BN
    t0 = trd.begin(TRACE)
    acc = op_tile(a, stride_am, w, stride_wn, m0, n0, M, N, K, 0, 1, BM, BN, BK,
                  EVEN_K, TMA, SWAP_AB, False)
    trd.end(trace_buf, t0, tags.GEMM_TILE, rank, TRACE)
    return m0, n0, acc


@triton.jit
def owned(m0, n0, rows, cols, first, m_local, N):
    """(mask, offsets) of a tile's elements among the m_local rows from row `first` (an
    owner's rows), offsets counted in a [m_local, N] row-major block from that row."""
    mask = (m0 + rows >= first) & (m0 + rows < first + m_local) & (n0 + cols < N)
    return mask, (m0 + rows - first).to(tl.int64) * N + n0 + cols
