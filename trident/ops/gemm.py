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
  issues TMA loads, a consumer group runs wgmma) as a per-config switch, TMA path only.
  On sm_90 with triton 3.6 it takes effect only with num_warps=4 (one consumer group)
  and an unflattened tile loop -- with 8 warps or flatten=True the compiler silently
  emits the plain pipelined kernel (tests/compile/sm90.py checks for setmaxnreg).
- Configurations per shape class from gemm_table.json beside this file (look-up is a
  few comparisons and a dict get; no autotuning at run time). `python -m
  trident.bench.gemm --write-table PATH` measures every candidate on one GPU and writes
  the table; entries not measured yet say so ("measured": false).

The Triton interpreter (CPU emulation) runs the same kernel, TMA path included; its
descriptors check alignment like the hardware. Global memory for the in-kernel
descriptors comes from Triton's allocator: `ensure_allocator()` sets a torch one unless
the process already has one.

fp32 inputs are refused with a TypeError that says to pass bfloat16 or float16 (no
TF32 path).
"""
from __future__ import annotations

import json
import os
from collections import OrderedDict

import torch
import triton
import triton.language as tl

from .._env import INTERPRET
from ..triton_launch import Launch, Live
from ._common import DOT_UPCAST, DTYPES, gemm_tile

TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemm_table.json")

# Candidates the benchmark tries for every shape class (names are table values).
# Shared memory per stage is (BM + BN) * BK * 2 bytes, plus a BM x BN output tile.
# (64x256 with warp specialisation trips an assertion in triton 3.6's sm_90 backend.)
def _config(bm: int, bn: int, bk: int, stages: int, warps: int, ws: bool = False) -> dict:
    return dict(BM=bm, BN=bn, BK=bk, GROUP_M=8, num_stages=stages, num_warps=warps,
                WARP_SPECIALIZE=ws)


CANDIDATES = {
    "128x256x64_s3_w8": _config(128, 256, 64, 3, 8),
    "128x128x64_s4_w8": _config(128, 128, 64, 4, 8),
    "128x128x64_s4_w4_ws": _config(128, 128, 64, 4, 4, ws=True),
    "128x128x128_s3_w8": _config(128, 128, 128, 3, 8),
    "64x128x64_s4_w4": _config(64, 128, 64, 4, 4),
    "64x256x64_s4_w4": _config(64, 256, 64, 4, 4),
    "64x128x64_s4_w4_ws": _config(64, 128, 64, 4, 4, ws=True),
}
# Under the interpreter: small tiles keep the CPU emulation fast, and few programs make
# each of them take several tiles.
INTERPRET_CONFIG = dict(BM=16, BN=32, BK=32, GROUP_M=2, num_stages=1, num_warps=4,
                        WARP_SPECIALIZE=False)
INTERPRET_PROGRAMS = 3

# Shape classes: upper edges of M, N and K (a value above the last edge is "big").
M_EDGES = (128, 512, 2048)
N_EDGES = (4096,)
K_EDGES = (4096,)


def _bucket(x: int, edges: tuple, letter: str) -> str:
    for e in edges:
        if x <= e:
            return f"{letter}{e}"
    return f"{letter}big"


def shape_class(M: int, N: int, K: int) -> str:
    """The table's class of a problem, e.g. "m512-n4096-kbig" (M <= 512, N <= 4096, K > 4096)."""
    return f"{_bucket(M, M_EDGES, 'm')}-{_bucket(N, N_EDGES, 'n')}-{_bucket(K, K_EDGES, 'k')}"


def all_classes() -> list[str]:
    ms = [*(f"m{e}" for e in M_EDGES), "mbig"]
    ns = [*(f"n{e}" for e in N_EDGES), "nbig"]
    ks = [*(f"k{e}" for e in K_EDGES), "kbig"]
    return [f"{m}-{n}-{k}" for m in ms for n in ns for k in ks]


_table: dict | None = None


def load_table(path: str = TABLE_PATH) -> dict:
    """class -> config dict (the table's entries resolved to CANDIDATES or given inline)."""
    global _table
    if path == TABLE_PATH and _table is not None:
        return _table
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {}
    candidates = {**CANDIDATES, **data.get("candidates", {})}
    table = {}
    for cls, entry in data.get("classes", {}).items():
        cfg = entry["config"]
        table[cls] = dict(candidates[cfg]) if isinstance(cfg, str) else dict(cfg)
    if path == TABLE_PATH:
        _table = table
    return table


def write_table(path: str, choices: dict, about: str, measured: bool) -> str:
    """Write a table: choices = class -> (candidate name, {note fields}), e.g. the
    measured best of each class. Classes without a choice keep the default table's."""
    try:
        with open(TABLE_PATH) as f:
            base = json.load(f).get("classes", {})
    except FileNotFoundError:
        base = {}
    classes = {}
    for cls in all_classes():
        if cls in choices:
            name, note = choices[cls]
            classes[cls] = {"config": name, "measured": measured, **note}
        elif cls in base:
            classes[cls] = base[cls]
    with open(path, "w") as f:
        json.dump({"about": about, "candidates": CANDIDATES, "classes": classes}, f, indent=1)
        f.write("\n")
    return path


def config_for(M: int, N: int, K: int) -> dict:
    """The GEMM config of a problem on a GPU (the interpreter's under TRITON_INTERPRET)."""
    if INTERPRET:
        return dict(INTERPRET_CONFIG)
    cfg = load_table().get(shape_class(M, N, K))
    if cfg is None:          # a class missing from the table: the tutorial's default
        cfg = CANDIDATES["64x128x64_s4_w4" if M <= 64 else "128x256x64_s3_w8"]
    return dict(cfg)


# ---------------------------------------------------------------------------- device side
@triton.jit
def tile_position(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Tile index -> (row block, column block), GROUP_M row blocks at a time so that the
    tiles running together share their w columns (and a's rows) in L2."""
    in_group = GROUP_M * num_pid_n
    first_m = (tile // in_group) * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % in_group) % size_m
    pid_n = (tile % in_group) // size_m
    return pid_m, pid_n


@triton.jit
def dot_tile_tma(a_desc, w_desc, m0, n0, K, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr):
    """fp32 [BM, BN] tile of a[m0:, :] @ w[n0:, :].T through TMA descriptors (blocks
    [BM, BK] and [BN, BK]); TMA zero-fills rows, columns and K past the tensor's end."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for ki in range(0, tl.cdiv(K, BK)):
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
    with [BR, BC] blocks (TMA), or the pointer itself (pointer path)."""
    if TMA:
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
def _gemm_kernel(a, w, bias, out, M, N, K, stride_am, stride_wn, stride_om,
                 NUM_PROGRAMS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, GROUP_M: tl.constexpr, TMA: tl.constexpr,
                 WARP_SPECIALIZE: tl.constexpr, EVEN_K: tl.constexpr,
                 HAS_BIAS: tl.constexpr):
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    num_tiles = num_pid_m * num_pid_n
    if TMA:
        a_desc = tl.make_tensor_descriptor(a, shape=[M, K], strides=[stride_am, 1],
                                           block_shape=[BM, BK])
        w_desc = tl.make_tensor_descriptor(w, shape=[N, K], strides=[stride_wn, 1],
                                           block_shape=[BN, BK])
        out_desc = tl.make_tensor_descriptor(out, shape=[M, N], strides=[stride_om, 1],
                                             block_shape=[BM, BN])
    # The epilogue recomputes its tile from a counter of its own, as the tutorial does:
    # a value used in both the prologue and the epilogue of the flattened loop hurts the
    # pipeliner. Flattening the two loops keeps TMA loads of the next tile going during
    # the epilogue, but stops Hopper's warp specialisation: one or the other.
    tile_c = start - NUM_PROGRAMS
    for tile in tl.range(start, num_tiles, NUM_PROGRAMS, flatten=not WARP_SPECIALIZE,
                         warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = tile_position(tile, num_pid_m, num_pid_n, GROUP_M)
        if TMA:
            acc = dot_tile_tma(a_desc, w_desc, pid_m * BM, pid_n * BN, K, BM, BN, BK)
        else:
            acc = gemm_tile(a, stride_am, w, stride_wn, pid_m * BM, pid_n * BN, M, N, K,
                            BM, BN, BK, EVEN_K)
        tile_c += NUM_PROGRAMS
        pid_m, pid_n = tile_position(tile_c, num_pid_m, num_pid_n, GROUP_M)
        m0 = pid_m * BM
        n0 = pid_n * BN
        if HAS_BIAS:
            cols = n0 + tl.arange(0, BN)
            acc += tl.load(bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        if TMA:
            out_desc.store([m0, n0], acc.to(out.dtype.element_ty))
        else:
            rows = m0 + tl.arange(0, BM)
            cols = n0 + tl.arange(0, BN)
            ptrs = out + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
            tl.store(ptrs, acc.to(out.dtype.element_ty),
                     mask=(rows[:, None] < M) & (cols[None, :] < N))


# ---------------------------------------------------------------------------- host side
def _torch_alloc(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator() -> None:
    """In-kernel TMA descriptors live in global scratch memory that Triton asks its
    allocator for at every launch: set a torch one unless the process has one already."""
    from triton.runtime import _allocation
    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_torch_alloc)


def tma_compatible(*tensors) -> bool:
    """Whether TMA descriptors can address these 2-D tensors: rows contiguous, base and
    row stride 16-byte aligned."""
    for t in tensors:
        if t.stride(1) != 1 or t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
            return False
    return True


_NUM_SMS: dict = {}


def num_sms(device: torch.device) -> int:
    """Persistent programs at most: one per SM (INTERPRET_PROGRAMS under the interpreter).
    A constexpr of the kernel -- the stride of its tile loop -- fixed per device, so that
    every shape shares one compiled kernel; a launch with fewer tiles starts fewer programs."""
    if INTERPRET or device.type != "cuda":
        return INTERPRET_PROGRAMS
    sms = _NUM_SMS.get(device.index)
    if sms is None:
        sms = _NUM_SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return sms


def check(a, w, bias=None, out=None) -> None:
    """Input checks of `matmul` (TypeError / ValueError that say what was expected)."""
    for name, t in (("a", a), ("w", w)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"gemm: {name} must be a 2-D matrix, got shape {list(t.shape)}")
        if t.dtype == torch.float32:
            raise TypeError(f"gemm: {name} is float32; trident's GEMM takes bfloat16 or float16 "
                            f"(pass {name}.to(torch.bfloat16), or use torch.matmul for fp32/TF32)")
        if t.dtype not in DTYPES:
            raise TypeError(f"gemm: {name} must be bfloat16 or float16, got {t.dtype}")
        if t.stride(1) != 1:
            raise ValueError(f"gemm: {name} needs a contiguous last dimension, got strides "
                             f"{t.stride()}")
    if w.dtype != a.dtype:
        raise TypeError(f"gemm: w has dtype {w.dtype} but a has {a.dtype}; they must match")
    if a.shape[1] != w.shape[1]:
        raise ValueError(f"gemm: a is [M, K] = {list(a.shape)} and w is [N, K] = "
                         f"{list(w.shape)} (nn.Linear layout): their K differ")
    if a.device != w.device:
        raise ValueError(f"gemm: a is on {a.device} and w on {w.device}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dim() != 1 or
                             bias.shape[0] != w.shape[0] or bias.device != a.device or
                             bias.dtype not in (*DTYPES, torch.float32)):
        raise ValueError(f"gemm: bias must be a [{w.shape[0]}] bf16/fp16/fp32 tensor on "
                         f"{a.device}, got {bias!r:.80}")
    shape = (a.shape[0], w.shape[0])
    if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or
                            out.dtype != a.dtype or out.device != a.device or
                            out.stride(1) != 1):
        raise ValueError(f"gemm: out must be a {list(shape)} {a.dtype} tensor on {a.device} "
                         f"with a contiguous last dimension")


def launch_args(a, w, bias, out, config: dict | None = None, tma: bool | None = None):
    """(grid, args, kwargs) of one launch of the GEMM kernel for checked tensors.
    config: a config dict (default: the table's for this shape); tma: force the TMA
    (True) or the pointer path (False); default TMA where the tensors allow it."""
    M, K = a.shape
    N = w.shape[0]
    cfg = dict(config) if config is not None else config_for(M, N, K)
    if tma is None:
        tma = tma_compatible(a, w, out)
    elif tma and not tma_compatible(a, w, out):
        raise ValueError("gemm: TMA needs 16-byte aligned tensors and row strides (K and N "
                         "multiples of 8 for bf16/fp16)")
    if tma and not INTERPRET:
        ensure_allocator()
    tiles = triton.cdiv(M, cfg["BM"]) * triton.cdiv(N, cfg["BN"])
    sms = num_sms(a.device)
    kwargs = dict(NUM_PROGRAMS=sms, BM=cfg["BM"], BN=cfg["BN"], BK=cfg["BK"],
                  GROUP_M=cfg["GROUP_M"], TMA=tma,
                  WARP_SPECIALIZE=bool(cfg["WARP_SPECIALIZE"]) and tma,
                  EVEN_K=K % cfg["BK"] == 0, HAS_BIAS=bias is not None,
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    args = (a, w, bias if bias is not None else a, out, M, N, K,
            a.stride(0), w.stride(0), out.stride(0))
    return (min(tiles, sms),), args, kwargs


# Launches of recent signatures (trident/triton_launch.py: one C call per launch after the
# first): key = the tensors' addresses, shapes, strides, dtypes, the config and the path.
_launches: OrderedDict = OrderedDict()
_CAPACITY = 64


def _key(t):
    return None if t is None else (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device)


def matmul(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None, config: dict | None = None,
           tma: bool | None = None) -> torch.Tensor:
    """a @ w.T + bias -> [a.shape[0], w.shape[0]] in a's dtype (fp32 accumulation).

    a: [M, K], w: [N, K] (nn.Linear layout), bias: [N] (bf16, fp16 or fp32), both bf16
    or fp16. config: a dict like CANDIDATES' (default: gemm_table.json's entry for this
    shape class); tma: see launch_args.
    """
    check(a, w, bias, out)
    fresh = out is None
    if fresh:
        out = torch.empty(a.shape[0], w.shape[0], dtype=a.dtype, device=a.device)
    if INTERPRET:                 # the ordinary launch; a Launch would keep the tensors
        from .. import emulation
        emulation.install()
        grid, args, kwargs = launch_args(a, w, bias, out, config, tma)
        _gemm_kernel[grid](*args, **kwargs)
        return out
    key = (_key(a), _key(w), _key(bias), None if fresh else _key(out), out.dtype,
           None if config is None else tuple(sorted(config.items())), tma)
    launch = _launches.get(key)
    if launch is None:
        grid, args, kwargs = launch_args(a, w, bias, out, config, tma)
        args = args[:3] + (Live(0),) + args[4:] if fresh else args
        launch = _launches[key] = Launch(_gemm_kernel, grid, args, kwargs, (out,))
        if len(_launches) > _CAPACITY:
            _launches.popitem(last=False)
    else:
        _launches.move_to_end(key)
    launch((out,))
    return out
