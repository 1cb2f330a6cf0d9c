"""gemm: out [M, N] = a [M, K] @ w.T + bias, w [N, K] in nn.Linear layout -- the GEMM core
that the fused ops build on, and a plain Triton GEMM on its own (`matmul`).

What Hopper needs, after Triton's persistent-matmul tutorial (09-persistent-matmul):
- TMA: operand tiles come through tensor descriptors made in the kernel
  (`tl.make_tensor_descriptor`), so the copy engine of the SM loads them, zero-fills what
  lies past M, N and K, and the store clips at the edges -- no masks, no address math.
  The descriptors need 16-byte aligned bases and row strides (K and N multiples of 8
  for bf16/fp16); other tensors take the pointer path below, same kernel.
- Persistent programs, one per SM, each taking output tiles pid, pid + P, pid + 2P, ...
  in grouped order (GROUP_M row blocks share one column block of w in L2).
- Warp specialisation (`tl.range(..., warp_specialize=True)`: a producer warp group
  issues TMA loads, consumer groups run wgmma) as a per-config switch, TMA path only,
  with in-kernel descriptors only (launch_args), and no candidate uses it: see the note
  above CANDIDATES (gemm_configs.py). On sm_90 with triton 3.6 it takes effect only with num_warps=4 and
  an unflattened tile loop -- with 8 warps or flatten=True the compiler silently emits
  the plain pipelined kernel (tests/compile/sm90.py checks for setmaxnreg).
- Configurations per GPU model and shape class from gemm_table.json beside this file
  (trident/ops/gemm_tables.py: the table `trident tune --gemm` measured on this GPU
  model in the user's cache, else the GPU's own, else the nearest measured one; look-up is
  a few comparisons and a dict get, once per GPU; no autotuning at run time). `python -m
  trident.bench.gemm --update-table PATH` measures every candidate on one GPU and
  writes that GPU's table into PATH; entries not measured say so ("measured": false).
- Swap-AB (config SWAP_AB) for small M: the kernel computes out.T = w @ a.T, so that N
  fills the rows of the tile (wgmma's M, 64 per warp group) and the few rows of a its
  16-64 columns; the epilogue stores each tile transposed. The fused ops run it too
  (trident/ops/fused_tile.py: they transpose the tile in registers, so that their
  communication still moves tiles of out).

- Split-K (config SPLIT_K > 1: at most that many K slices per output tile) for problems
  with too few output tiles to fill the SMs (small M). Deterministic: each slice writes
  its fp32 partial tile into a workspace, then counts itself in a per-tile arrival
  counter (acq_rel atomic); the slice that arrives last sums the partials in slice order
  (0, 1, ..., whatever order they arrived in) and stores the output. It also sets the
  counter back to 0, so after every launch all counters are 0 again: no memset between
  calls, and a CUDA graph can replay the launch (the rearm of trident/language/epoch.py's
  last_program_out, per tile). How many slices a launch uses: `split_k_for`
  (gemm_configs.py: at most one wave of work units over the SMs; 1 when the tiles fill
  the GPU).
  The workspace (partials + counters) is kept per device, stream and size bucket for the
  life of the process (graphs keep its addresses); launches on one stream are ordered,
  so they can share it. It is made outside CUDA-graph pools (_common.outside_graph_pools).
  The fused ops keep theirs with their op's workspace instead (fused_tile.split_buffers).
- Stream-K (config STREAM_K) where the tiles leave SMs idle in their last wave: P
  programs (stream_k_for, gemm_configs.py) share the last waves' BK-steps evenly across
  tile boundaries; shared tiles take split-K's workspace and arrival protocol, summed in
  program order (deterministic, graph-safe): _stream_k.
- Host-side TMA descriptors (desc="host", the default of `matmul` on the TMA path):
  triton.tools.tensor_descriptor.TensorDescriptor objects for a and w, made once per
  launch plan (the plan knows the addresses) and passed as kernel arguments, so the
  kernel needs no global scratch and the launch no per-call allocation. The output is
  then stored through pointers (a fresh output has a new address every call). desc=
  "kernel" makes all three descriptors in the kernel (`tl.make_tensor_descriptor`), as
  the fused ops do; their global memory comes from Triton's allocator:
  `ensure_allocator()` sets a torch one unless the process already has one.

The Triton interpreter (CPU emulation) runs the same kernel, TMA paths included; its
descriptors check alignment like the hardware.

fp32 inputs are refused with a TypeError that says to pass bfloat16 or float16 (no
TF32 path).
"""
from __future__ import annotations

from collections import OrderedDict

import torch
import triton
import triton.language as tl

from ..runtime._env import INTERPRET
from ..runtime.placement import usable_sms
from ..runtime.triton_launch import Launch, Live
from . import gemm_tables
from ._common import (DOT_UPCAST, arrive_partial, finish_slice, gemm_tile,  # noqa: F401
                      tile_position)
from .gemm_host import (_Address, _split_workspaces, addresses_only, check,  # noqa: F401
                        host_descriptors, split_workspace, tma_compatible)
# the candidates and the split-K / stream-K choices live in gemm_configs.py (pure Python)
from .gemm_configs import (CANDIDATES, KNOWN, base_candidate, split_for_tiles,  # noqa: F401
                           split_k_for, stream_k_for, stream_k_tiles)

# Under the interpreter: small tiles keep the CPU emulation fast, and few programs make
# each of them take several tiles.
INTERPRET_CONFIG = dict(BM=16, BN=32, BK=32, GROUP_M=2, num_stages=1, num_warps=4,
                        WARP_SPECIALIZE=False, SPLIT_K=1, SWAP_AB=False)
INTERPRET_PROGRAMS = 3

# Tables per GPU model and shape class (trident/ops/gemm_tables.py): the table of the GPU
# a launch runs on, or the nearest measured one.
TABLE_PATH = gemm_tables.TABLE_PATH
_picked: dict = {}          # (GPU name, capability) -> its GpuTable (or None)
_identities: dict = {}      # CUDA device index -> (name, capability)


def gpu_identity(device: torch.device | None = None) -> tuple:
    """(device name, compute capability) of a CUDA device (default: the current one), the
    key of its GEMM table; ("cpu", None) without CUDA."""
    if not torch.cuda.is_available() or (device is not None and device.type != "cuda"):
        return ("cpu", None)
    index = torch.cuda.current_device() if device is None or device.index is None \
        else device.index
    if index not in _identities:
        _identities[index] = (torch.cuda.get_device_name(index),
                              tuple(torch.cuda.get_device_capability(index)))
    return _identities[index]


def table_for(gpu: tuple | None = None) -> gemm_tables.GpuTable | None:
    """The table of a GPU given as (name, capability) (default: the current device's):
    the one `trident tune --gemm` measured on it, its own in the package, or the nearest
    measured one (gemm_tables.lookup)."""
    gpu = tuple(gpu) if gpu is not None else gpu_identity()
    if gpu not in _picked:
        _picked[gpu] = gemm_tables.lookup(gpu[0], gpu[1])[0]
    return _picked[gpu]


def resolve(config) -> dict:
    """A table entry's config (a candidate's name, or a dict) as a full config dict."""
    if isinstance(config, str):
        listed = gemm_tables.read()[0] if config not in KNOWN else {}
        if config not in KNOWN and config not in listed:
            raise ValueError(f"gemm: the table names the config {config!r}, which is neither "
                             f"a candidate of trident/ops/gemm_configs.py nor listed in its file")
        config = KNOWN[config] if config in KNOWN else listed[config]
    return {"SPLIT_K": 1, "SWAP_AB": False, **config}


def triton_config(cfg: dict) -> dict:
    """The config gemm.py's kernel runs for `cfg`: a Gluon one's TWIN (gemm_ws.py's
    kernel runs only in `matmul`, where _launch_of can take it), any other as it is."""
    return resolve(cfg["TWIN"]) if cfg.get("GLUON") else cfg


def config_for(M: int, N: int, K: int, split_k: bool = False, gpu: tuple | None = None) -> dict:
    """The GEMM config of a problem on a GPU ((name, capability), default the current
    device; the interpreter's config under TRITON_INTERPRET).
    split_k: the standalone GEMM's config (`matmul`): the table entry as it is, SPLIT_K
    and SWAP_AB included. Without it, the fused kernels' config, which take tiles from
    their own queue and know neither: the entry's fused_config where the entry is
    swap-AB (its best plain candidate), the tiles without SPLIT_K, SWAP_AB and STREAM_K
    keys."""
    if INTERPRET:
        cfg = dict(INTERPRET_CONFIG)
    else:
        table = table_for(gpu)
        entry = table.entry(M, N, K) if table is not None else None
        cfg = None
        if entry is not None:
            cfg = resolve(entry["config"] if split_k else
                          entry.get("fused_config", entry["config"]))
        if cfg is not None and not split_k:
            cfg = triton_config(cfg)       # the fused kernels tile with gemm.py's kernel
        if cfg is None or (not split_k and cfg["SWAP_AB"]):
            # no table, or a swap-AB entry without a plain one: the tutorial's default
            cfg = resolve("64x128x64_s4_w4" if M <= 64 else "128x256x64_s3_w8")
    if not split_k:
        cfg.pop("SPLIT_K", None)
        cfg.pop("SWAP_AB", None)
        cfg.pop("STREAM_K", None)
    return cfg


# ---------------------------------------------------------------------------- device side
@triton.jit
def dot_tile_tma(a_desc, w_desc, m0, n0, K, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr):
    """fp32 [BM, BN] tile of a[m0:, :] @ w[n0:, :].T through TMA descriptors (blocks
    [BM, BK] and [BN, BK]); TMA zero-fills rows, columns and K past the tensor's end."""
    return dot_steps_tma(a_desc, w_desc, m0, n0, 0, tl.cdiv(K, BK), BM, BN, BK)


@triton.jit
def dot_steps_tma(a_desc, w_desc, m0, n0, k_lo, k_hi, BM: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr):
    """The TMA k-loop: dot_tile_tma over the BK-steps k_lo <= ki < k_hi only."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for ki in range(k_lo, k_hi):
        a = a_desc.load([m0, ki * BK])
        w = w_desc.load([n0, ki * BK])
        if DOT_UPCAST:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, w.T, acc)
    return acc


@triton.jit
def operand(ptr, rows, cols, stride, BR: tl.constexpr, BC: tl.constexpr, TMA: tl.constexpr):
    """What a fused kernel loads a [rows, cols] row-major operand through: a TMA descriptor
    with [BR, BC] blocks (TMA), or the pointer itself (pointer path). A descriptor made on
    the host (host_descriptors: no global scratch for the launch) is taken as it is; from
    a pointer, one is made here."""
    if TMA:
        if isinstance(ptr, tl.core.tensor_descriptor_base):
            op = ptr
        else:
            op = tl.make_tensor_descriptor(ptr, shape=[rows, cols], strides=[stride, 1],
                                           block_shape=[BR, BC])
    else:
        op = ptr
    return op


@triton.jit
def dot_tile(a, stride_am, w, stride_wn, m0, n0, M, N, K, BM: tl.constexpr,
             BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr, TMA: tl.constexpr):
    """fp32 [BM, BN] tile of a[m0:, :] @ w[n0:, :].T, a and w from `operand`: TMA loads
    (dot_tile_tma) or masked pointer loads (gemm_tile). Rows and columns past M and N are
    zeros or repeats, never to be stored."""
    if TMA:
        acc = dot_tile_tma(a, w, m0, n0, K, BM, BN, BK)
    else:
        acc = gemm_tile(a, stride_am, w, stride_wn, m0, n0, M, N, K, BM, BN, BK, EVEN_K)
    return acc


@triton.jit
def dot_slice(a, stride_am, w, stride_wn, m0, n0, M, N, K, k_lo, k_hi, BM: tl.constexpr,
              BN: tl.constexpr, BK: tl.constexpr, TMA: tl.constexpr):
    """fp32 [BM, BN] tile of a[m0:, k] @ w[n0:, k].T over the BK-steps k_lo <= ki < k_hi
    (a split-K slice), a and w descriptors (TMA) or pointers (rows and columns past M and
    N clamped, K masked; those rows and columns are never stored)."""
    if TMA:
        acc = dot_steps_tma(a, w, m0, n0, k_lo, k_hi, BM, BN, BK)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        rows = (m0 + tl.arange(0, BM)) % M
        cols = (n0 + tl.arange(0, BN)) % N
        offs_k = k_lo * BK + tl.arange(0, BK)
        a_ptrs = a + rows[:, None].to(tl.int64) * stride_am + offs_k[None, :]
        w_ptrs = w + cols[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
        for ki in range(k_lo, k_hi):
            x = tl.load(a_ptrs, mask=offs_k[None, :] < K - (ki - k_lo) * BK, other=0.0)
            y = tl.load(w_ptrs, mask=offs_k[:, None] < K - (ki - k_lo) * BK, other=0.0)
            if DOT_UPCAST:
                x = x.to(tl.float32)
                y = y.to(tl.float32)
            acc = tl.dot(x, y, acc)
            a_ptrs += BK
            w_ptrs += BK
    return acc


@triton.jit
def _epilogue(acc, dst, bias, m0, n0, M, N, stride_om, BM: tl.constexpr, BN: tl.constexpr,
              HAS_BIAS: tl.constexpr, OUT_DESC: tl.constexpr, SWAP_AB: tl.constexpr):
    """acc (+ bias) -> out[m0:m0+BM, n0:n0+BN] in out's dtype: dst is out's TMA descriptor
    (OUT_DESC; the store clips at the edges) or out itself (masked pointer store).
    SWAP_AB: acc is a tile of out.T (rows: out's columns, bias along them), stored
    through pointers to out[n0:n0+BN, m0:m0+BM]."""
    rows = m0 + tl.arange(0, BM)
    cols = n0 + tl.arange(0, BN)
    if HAS_BIAS:
        if SWAP_AB:
            acc += tl.load(bias + rows, mask=rows < M, other=0.0).to(tl.float32)[:, None]
        else:
            acc += tl.load(bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if OUT_DESC:
        dst.store([m0, n0], acc.to(dst.dtype))
    else:
        if SWAP_AB:
            ptrs = dst + cols[None, :].to(tl.int64) * stride_om + rows[:, None]
        else:
            ptrs = dst + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
        tl.store(ptrs, acc.to(dst.dtype.element_ty),
                 mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _gemm_kernel(a, w, bias, out, partials, counters, M, N, K, stride_am, stride_wn,
                 stride_om, split_k, NUM_PROGRAMS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, GROUP_M: tl.constexpr, TMA: tl.constexpr,
                 HOST_DESC: tl.constexpr, SPLIT: tl.constexpr,
                 WARP_SPECIALIZE: tl.constexpr, EVEN_K: tl.constexpr,
                 HAS_BIAS: tl.constexpr, SWAP_AB: tl.constexpr,
                 STREAM_K: tl.constexpr = False):
    """a, w: pointers, or TMA descriptors made on the host (HOST_DESC; blocks [BM, BK] and
    [BN, BK]); out: a pointer. SPLIT: split_k (> 1) K slices per tile, with partials
    (fp32, [tiles * split_k, BM * BN]) and counters (int32, one per tile, 0 between
    launches) of the split-K workspace; split_k is a runtime value, so that one compiled
    kernel per config serves every slice count. STREAM_K (SPLIT off): stream-K over
    split_k programs (the grid), partials [2 * split_k, BM * BN] and counters (one per
    stream-K tile) of the same workspace: see _stream_k. SWAP_AB: the host passes the
    layer's w as a and its a as w (M, N and their strides too), so the tiles are of out.T
    = w @ a.T; only the epilogue knows (it stores each tile transposed, through pointers)."""
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    num_tiles = num_pid_m * num_pid_n
    OUT_DESC: tl.constexpr = TMA and not HOST_DESC and not SWAP_AB
    if TMA:
        if HOST_DESC:
            a_op = a
            w_op = w
            dst = out
        else:
            a_op = tl.make_tensor_descriptor(a, shape=[M, K], strides=[stride_am, 1],
                                             block_shape=[BM, BK])
            w_op = tl.make_tensor_descriptor(w, shape=[N, K], strides=[stride_wn, 1],
                                             block_shape=[BN, BK])
            if OUT_DESC:
                dst = tl.make_tensor_descriptor(out, shape=[M, N], strides=[stride_om, 1],
                                                block_shape=[BM, BN])
            else:
                dst = out
    else:
        a_op = a
        w_op = w
        dst = out
    if STREAM_K:
        _stream_k(a_op, w_op, dst, bias, partials, counters, start, split_k, M, N, K,
                  stride_am, stride_wn, stride_om, num_pid_m, num_pid_n, BM, BN, BK,
                  GROUP_M, TMA, HAS_BIAS, OUT_DESC, SWAP_AB)
    elif not SPLIT:
        # The epilogue recomputes its tile from a counter of its own, as the tutorial
        # does: a value used in both the prologue and the epilogue of the flattened loop
        # hurts the pipeliner. Flattening the two loops keeps TMA loads of the next tile
        # going during the epilogue, but stops Hopper's warp specialisation: one or the
        # other.
        tile_c = start - NUM_PROGRAMS
        for tile in tl.range(start, num_tiles, NUM_PROGRAMS, flatten=not WARP_SPECIALIZE,
                             warp_specialize=WARP_SPECIALIZE):
            pid_m, pid_n = tile_position(tile, num_pid_m, num_pid_n, GROUP_M)
            if TMA:
                acc = dot_tile_tma(a_op, w_op, pid_m * BM, pid_n * BN, K, BM, BN, BK)
            else:
                acc = gemm_tile(a, stride_am, w, stride_wn, pid_m * BM, pid_n * BN, M, N, K,
                                BM, BN, BK, EVEN_K)
            tile_c += NUM_PROGRAMS
            pid_m, pid_n = tile_position(tile_c, num_pid_m, num_pid_n, GROUP_M)
            _epilogue(acc, dst, bias, pid_m * BM, pid_n * BN, M, N, stride_om, BM, BN,
                      HAS_BIAS, OUT_DESC, SWAP_AB)
    else:
        # Split-K: work unit u = tile * split_k + slice; slice s takes the BK-steps
        # [s * steps // split_k, (s + 1) * steps // split_k). The slices of a tile are
        # neighbouring units, so they run at about the same time.
        steps = tl.cdiv(K, BK)
        for unit in tl.range(start, num_tiles * split_k, NUM_PROGRAMS):
            tile = unit // split_k
            s = unit % split_k
            pid_m, pid_n = tile_position(tile, num_pid_m, num_pid_n, GROUP_M)
            acc = dot_slice(a_op, stride_am, w_op, stride_wn, pid_m * BM, pid_n * BN, M, N,
                            K, s * steps // split_k, (s + 1) * steps // split_k, BM, BN, BK,
                            TMA)
            last, total = finish_slice(acc, partials, counters, tile, s, split_k, BM, BN)
            if last:
                _epilogue(total, dst, bias, pid_m * BM, pid_n * BN, M, N, stride_om, BM, BN,
                          HAS_BIAS, OUT_DESC, SWAP_AB)


@triton.jit
def _stream_k(a_op, w_op, dst, bias, partials, counters, start, programs, M, N, K,
              stride_am, stride_wn, stride_om, num_pid_m, num_pid_n, BM: tl.constexpr,
              BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, TMA: tl.constexpr,
              HAS_BIAS: tl.constexpr, OUT_DESC: tl.constexpr, SWAP_AB: tl.constexpr):
    """Stream-K over `programs` programs, this one `start`. The first stream_k_tiles(tiles,
    programs) tiles (all but the last one to two waves' worth) run data-parallel; the
    rest are one sequence of BK-steps (tile-major), of which program p takes [p * iters //
    programs, (p + 1) * iters // programs), across tile boundaries. A tile one program
    covers whole is stored at once; a shared one goes through arrive_partial (split-K's
    protocol): each program's partial in a slot of its own (2p: the first tile of its
    range, 2p + 1: its last), the last to arrive sums the slots in program order (fixed
    by the shape and `programs`: deterministic), rearms the counter and stores the tile.
    Nobody waits for anybody: no deadlock whatever programs run at a time."""
    num_tiles = num_pid_m * num_pid_n
    steps = tl.cdiv(K, BK)
    dp_tiles = tl.maximum(num_tiles // programs - 1, 0) * programs
    for tile in range(start, dp_tiles, programs):
        pid_m, pid_n = tile_position(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = dot_slice(a_op, stride_am, w_op, stride_wn, pid_m * BM, pid_n * BN, M, N, K,
                        0, steps, BM, BN, BK, TMA)
        _epilogue(acc, dst, bias, pid_m * BM, pid_n * BN, M, N, stride_om, BM, BN,
                  HAS_BIAS, OUT_DESC, SWAP_AB)
    iters = (num_tiles - dp_tiles) * steps
    g0 = start * iters // programs
    g1 = (start + 1) * iters // programs
    t_first = g0 // steps
    for t in range(t_first, tl.where(g1 > g0, tl.cdiv(g1, steps), t_first)):
        k_lo = tl.maximum(g0 - t * steps, 0)
        k_hi = tl.minimum(g1 - t * steps, steps)
        pid_m, pid_n = tile_position(dp_tiles + t, num_pid_m, num_pid_n, GROUP_M)
        acc = dot_slice(a_op, stride_am, w_op, stride_wn, pid_m * BM, pid_n * BN, M, N, K,
                        k_lo, k_hi, BM, BN, BK, TMA)
        # the programs holding this tile's first and last step: p(g) = ((g + 1) * P - 1)
        # // iters is the one with p * iters // P <= g < (p + 1) * iters // P
        p_lo = ((t * steps + 1) * programs - 1) // iters
        p_hi = ((t + 1) * steps * programs - 1) // iters
        done = p_lo == p_hi
        if not done:
            slot = partials + (2 * start + (t != t_first).to(tl.int32)).to(tl.int64) * \
                (BM * BN)
            done = arrive_partial(acc, slot, counters, t, p_hi - p_lo + 1, BM, BN)
            if done:
                tl.store(counters + t, 0)                # rearmed for the next launch
                offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
                acc = tl.zeros((BM, BN), dtype=tl.float32)
                for q in range(p_lo, p_hi + 1):          # program order: deterministic
                    first_q = (q * iters // programs) // steps
                    slot = partials + (2 * q + (t != first_q).to(tl.int32)).to(tl.int64) * \
                        (BM * BN)
                    acc += tl.load(slot + offs, cache_modifier=".cg")
        if done:
            _epilogue(acc, dst, bias, pid_m * BM, pid_n * BN, M, N, stride_om, BM, BN,
                      HAS_BIAS, OUT_DESC, SWAP_AB)


# ---------------------------------------------------------------------------- host side
def _torch_alloc(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """In-kernel TMA descriptors live in global scratch memory that Triton asks its
    allocator for at every launch: set a torch one unless the process has one already."""
    from triton.runtime import _allocation
    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_torch_alloc)


def num_sms(device: torch.device) -> int:
    """Persistent programs at most: one per SM of this rank's share of the GPU
    (trident/runtime/placement.py; INTERPRET_PROGRAMS under the interpreter). A constexpr of the
    kernel -- the stride of its tile loop -- fixed per device, so that every shape shares
    one compiled kernel; a launch with fewer tiles starts fewer programs."""
    if INTERPRET or device.type != "cuda":
        return INTERPRET_PROGRAMS
    return usable_sms(device)


DESCS = ("host", "kernel")


def launch_args(a, w, bias, out, config: dict | None = None, tma: bool | None = None,
                desc: str | None = None, split_k: int | None = None):
    """(grid, args, kwargs) of one launch of the GEMM kernel for checked tensors.
    config: a config dict (default: the table's for this shape); tma: force the TMA
    (True) or the pointer path (False); default TMA where the tensors allow it. desc:
    where the TMA descriptors are made, "host" or "kernel": default "host", but "kernel"
    for a warp-specialised launch, which refuses "host" (see the note above CANDIDATES, gemm_configs.py).
    split_k: this many K slices exactly (default: split_k_for's choice for the config's
    SPLIT_K). A swap-AB config (SWAP_AB) launches the kernel on (w, a): see _gemm_kernel."""
    M, K = a.shape
    N = w.shape[0]
    cfg = dict(config) if config is not None else \
        config_for(M, N, K, split_k=True, gpu=gpu_identity(a.device))
    cfg = triton_config(cfg)                    # gemm_ws.py's kernel: see _launch_of
    swap = bool(cfg.get("SWAP_AB", False))
    if swap and cfg["WARP_SPECIALIZE"]:
        raise ValueError("gemm: a config cannot be both swap-AB (SWAP_AB) and "
                         "warp-specialised (WARP_SPECIALIZE)")
    if tma is None:
        tma = tma_compatible(a, w, out)
    elif tma and not tma_compatible(a, w, out):
        raise ValueError("gemm: TMA needs 16-byte aligned tensors and row strides (K and N "
                         "multiples of 8 for bf16/fp16)")
    sms = num_sms(a.device)
    split = _slices(M, N, K, cfg, sms, split_k)
    # stream-K programs (0: none); an explicit split_k runs split-K (or nothing) instead
    stream = stream_k_for(M, N, K, cfg, sms) if split == 1 and split_k is None else 0
    ws = bool(cfg["WARP_SPECIALIZE"]) and tma and split == 1 and not stream
    if desc is None:
        desc = "kernel" if ws else "host"
    if desc not in DESCS:
        raise ValueError(f"gemm: desc must be one of {DESCS}, got {desc!r}")
    if ws and desc == "host":
        raise ValueError("gemm: a warp-specialised config (WARP_SPECIALIZE) needs in-kernel "
                         "descriptors: triton 3.6 splits its TMA loads into blocks that a "
                         "host-made descriptor cannot match, and the kernel hangs; pass "
                         "desc='kernel' or leave desc unset")
    host_desc = tma and desc == "host"
    if tma and not host_desc and not INTERPRET:
        ensure_allocator()
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    if swap:                                    # the kernel's a is w: out.T = w @ a.T
        a, w, M, N = w, a, N, M
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    if split > 1:
        if tiles * split * bm * bn >= 2 ** 31:
            raise ValueError(f"gemm: split_k={split} over {tiles} tiles of {bm}x{bn} needs "
                             f"more than 2**31 partial elements; use fewer slices")
        partials, counters = split_workspace(a.device, tiles * split * bm * bn, tiles)
    elif stream:                                # two partial slots a program (_stream_k)
        partials, counters = split_workspace(a.device, 2 * stream * bm * bn,
                                             tiles - stream_k_tiles(tiles, stream))
    else:
        partials = counters = a                 # not read
    if host_desc:
        from triton.tools.tensor_descriptor import TensorDescriptor
        a_arg = TensorDescriptor(a, [M, K], [a.stride(0), 1], [bm, bk])
        w_arg = TensorDescriptor(w, [N, K], [w.stride(0), 1], [bn, bk])
    else:
        a_arg, w_arg = a, w
    kwargs = dict(NUM_PROGRAMS=sms, BM=bm, BN=bn, BK=bk, GROUP_M=cfg["GROUP_M"], TMA=tma,
                  HOST_DESC=host_desc, SPLIT=split > 1, STREAM_K=stream > 0,
                  WARP_SPECIALIZE=ws,
                  EVEN_K=K % bk == 0, HAS_BIAS=bias is not None, SWAP_AB=swap,
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    args = (a_arg, w_arg, bias if bias is not None else a, out, partials, counters, M, N, K,
            a.stride(0), w.stride(0), out.stride(0), stream or split)
    return (stream or min(tiles * split, sms),), args, kwargs


def _slices(M: int, N: int, K: int, cfg: dict, sms: int, split_k) -> int:
    """K slices per tile of a launch: split_k, checked, or split_k_for's choice (None)."""
    if split_k is None:
        return split_k_for(M, N, K, cfg, sms)
    if not isinstance(split_k, int) or split_k < 1:
        raise ValueError(f"gemm: split_k must be a positive int, got {split_k!r}")
    return split_k


def _launch_of(a, w, bias, out, config, tma, desc, split_k):
    """(kernel, grid, args, kwargs, out's position in args) of a `matmul` launch: the
    warp-specialised Gluon kernel (gemm_ws.py) for a GLUON config where it can run (an
    sm_90 GPU, tensors TMA takes, host descriptors), with split_k_for's K slices (or
    split_k's), else gemm.py's kernel (a GLUON config by its TWIN)."""
    M, K = a.shape
    N = w.shape[0]
    cfg = config if config is not None else \
        config_for(M, N, K, split_k=True, gpu=gpu_identity(a.device))
    if cfg.get("GLUON") and not INTERPRET and tma is not False and desc in (None, "host") \
            and gpu_identity(a.device)[1] == (9, 0) and tma_compatible(a, w, out):
        from . import gemm_ws
        sms = num_sms(a.device)
        grid, args, kwargs = gemm_ws.launch_args(a, w, bias, out, cfg, sms,
                                                 _slices(M, N, K, cfg, sms, split_k))
        return gemm_ws.gemm_ws_kernel, grid, args, kwargs, 2
    grid, args, kwargs = launch_args(a, w, bias, out, cfg, tma, desc, split_k)
    return _gemm_kernel, grid, args, kwargs, 3


# Launches of recent signatures (trident/runtime/triton_launch.py: one C call per launch after the
# first): key = the tensors' addresses, shapes, strides, dtypes, the stream (the split-K
# workspace is per stream), the config and the path.
_launches: OrderedDict = OrderedDict()
_CAPACITY = 64
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _key(t):
    return None if t is None else (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device)


def matmul(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None, config: dict | None = None,
           tma: bool | None = None, desc: str | None = None,
           split_k: int | None = None) -> torch.Tensor:
    """a @ w.T + bias -> [a.shape[0], w.shape[0]] in a's dtype (fp32 accumulation).

    a: [M, K], w: [N, K] (nn.Linear layout), bias: [N] (bf16, fp16 or fp32), both bf16
    or fp16. config: a dict like CANDIDATES' (default: gemm_table.json's entry for this
    shape class); tma, desc, split_k: see launch_args.
    """
    check(a, w, bias, out)
    fresh = out is None
    if fresh:
        out = torch.empty(a.shape[0], w.shape[0], dtype=a.dtype, device=a.device)
    if INTERPRET:                 # the ordinary launch; a Launch would keep the tensors
        from ..runtime import emulation
        emulation.install()
        kernel, grid, args, kwargs, _ = _launch_of(a, w, bias, out, config, tma, desc, split_k)
        kernel[grid](*args, **kwargs)
        return out
    key = (_key(a), _key(w), _key(bias), None if fresh else _key(out), out.dtype,
           None if config is None else tuple(sorted(config.items())), tma, desc, split_k,
           _raw_stream(a.device.index) if _raw_stream is not None and a.is_cuda else None)
    launch = _launches.get(key)
    if launch is None:
        kernel, grid, args, kwargs, at = _launch_of(a, w, bias, out, config, tma, desc,
                                                    split_k)
        args = args[:at] + (Live(0),) + args[at + 1:] if fresh else args
        launch = _launches[key] = Launch(kernel, grid, args, kwargs, (out,))
        # the plan keeps addresses only (triton_launch.Launch): so do its descriptors
        addresses_only(launch, args[:2])
        if len(_launches) > _CAPACITY:
            _launches.popitem(last=False)
    else:
        _launches.move_to_end(key)
    launch((out,))
    return out
