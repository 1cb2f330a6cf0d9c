"""Host side that every collective shares: input checks, the per-context state (epoch
counter and flags), scratch and staging buffers on the heap, and launch sizes."""
from __future__ import annotations

import torch
import triton

from . import device

REDUCE_OPS = {"sum": 0, "max": 1, "min": 2}
REDUCE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Launch sizes. GPU: 16 KiB per program per step (16-byte vectors, 4 per thread with 8
# warps), up to 128 programs (about one per SM of an H100/H200). The interpreter runs
# programs one by one in Python, so there fewer, smaller programs are cheaper.
GPU_BLOCK_BYTES, GPU_MAX_PROGRAMS, GPU_NUM_WARPS = 16384, 128, 8
CPU_BLOCK_BYTES, CPU_MAX_PROGRAMS = 1024, 2
ALIGN = 64          # elements: slot strides and segment starts stay 16-byte aligned


class State:
    """Per-context collective state: epoch counter and flags (see device.py)."""

    def __init__(self, ctx):
        self.sync = ctx.zeros(2, dtype=torch.int64)
        self.flags = ctx.zeros(device.NUM_REGIONS * device.MAX_RANKS
                               * device.MAX_PROGRAMS, dtype=torch.int64)
        self.a2a_meta = ctx.zeros(2 * device.MAX_RANKS, dtype=torch.int64)
        self.a2a_check = ctx.zeros(1, dtype=torch.int64)
        self.offsets = ctx.zeros(device.MAX_RANKS, dtype=torch.int64)   # see device.py

    def reset(self):
        for t in (self.sync, self.flags, self.a2a_meta, self.a2a_check, self.offsets):
            t.zero_()


def state(ctx) -> State:
    return ctx.workspace("ccl.state", State)


def _size_class(nbytes: int) -> int:
    return max(1 << 16, 1 << (max(nbytes, 1) - 1).bit_length())


def scratch(ctx, nbytes: int, dtype: torch.dtype, key: str = "scratch") -> torch.Tensor:
    """A heap buffer of at least `nbytes`, viewed as `dtype`. One per size class (power of
    two), kept for the context's life: the same on every rank, no reallocation."""
    size = _size_class(nbytes)
    buf = ctx.workspace((f"ccl.{key}", size), lambda c: c.empty(size, dtype=torch.uint8))
    return buf.view(dtype)


def _mirror(plan, index: int, buf: torch.Tensor) -> torch.Tensor:
    """`buf` viewed as the call's tensor `index` (same dtype and shape)."""
    user = plan.tensors[index]
    return buf.view(torch.uint8).view(user.dtype).view(user.shape)


def _copy_in(plan, index: int, buf: torch.Tensor) -> None:
    """Add a step that copies the call's tensor `index` into `buf`."""
    mirror = _mirror(plan, index, buf)
    plan.add(lambda ts: mirror.copy_(ts[index]))


def _copy_back(plan, index: int, buf: torch.Tensor) -> None:
    """Add a step that copies `buf` back into the call's tensor `index`."""
    mirror = _mirror(plan, index, buf)
    plan.add(lambda ts: ts[index].copy_(mirror))


def stage(ctx, plan, t: torch.Tensor, index: int, key: str, copy_in: bool = True) -> torch.Tensor:
    """`t` itself when it lies on the heap, else a heap buffer of its size for the kernel
    that needs it there (`t` is a flat view of the call's tensor `index`). With copy_in,
    the plan copies the call's tensor into the buffer first. See `unstage`.

    Making the buffer is collective (a workspace), and only ranks whose tensor is not on
    the heap make it. Ranks that pass a heap tensor where a peer passes a plain one (or
    sizes in different size classes) therefore raise CallMismatchError naming both calls,
    on the plan's first call. Making the buffer on every rank would avoid that at the
    price of a heap-sized copy of every large input, which fills the heap."""
    if ctx.is_symmetric(t):
        return t
    nbytes = t.numel() * t.element_size()
    buf = scratch(ctx, nbytes, torch.uint8, key)[:nbytes].view(t.dtype)
    if copy_in:
        _copy_in(plan, index, buf)
    return buf


def unstage(plan, index: int, t: torch.Tensor, staged: torch.Tensor) -> None:
    """After the kernel's step: copy a staged buffer back into the call's tensor `index`."""
    if staged is not t:
        _copy_back(plan, index, staged)


def heap_offset(ctx, t: torch.Tensor) -> int:
    """Byte offset of heap tensor `t` from this rank's heap base (Context.heap_offset)."""
    return ctx.heap_offset(t)


def check_tensor(ctx, t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != ctx.device:
        raise ValueError(f"{name} is on {t.device}, but this rank's context is on {ctx.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")


def check_reduce(t: torch.Tensor, name: str, op: str) -> int:
    if t.dtype not in REDUCE_DTYPES:
        raise TypeError(f"{name}: reductions support bfloat16, float16 and float32, got {t.dtype}")
    if op not in REDUCE_OPS:
        raise ValueError(f"op must be one of {sorted(REDUCE_OPS)}, got {op!r}")
    return REDUCE_OPS[op]


def check_same_dtype(a: torch.Tensor, b: torch.Tensor, names: str) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{names} must have the same dtype, got {a.dtype} and {b.dtype}")


def word_type(nbytes, unit: int = 0) -> tuple[torch.dtype, int]:
    """(dtype, bytes) of the widest integer type (int32/int16/int8) that tiles every size in
    `nbytes` and `unit` bytes: as_words' word, known from sizes alone."""
    return next((w, s) for w, s in ((torch.int32, 4), (torch.int16, 2), (torch.int8, 1))
                if unit % s == 0 and all(n % s == 0 for n in nbytes))


def as_words(ctx, plan, specs, unit: int = 0):
    """Flat views of the call's tensors as the widest integer type (int32/int16/int8) that
    tiles all of them and `unit` bytes (e.g. a row), so data movement works for any dtype
    (bool, fp8, complex, ...).

    specs: (tensor, index among the call's tensors, is an input, is an output). The width
    depends only on sizes, which every rank agrees on, never on where a tensor lies: ranks
    that chose different widths would run different kernels. A tensor that is not aligned
    to the width here is staged through an aligned buffer (copied in before the
    kernel if an input; back after it if an output: call the returned `finish()` once the
    kernel's step is added). Returns (views, finish).
    """
    nbytes = [t.numel() * t.element_size() for t, *_ in specs]
    wide, size = word_type(nbytes, unit)
    views, back = [], []
    for (t, index, is_in, is_out), n in zip(specs, nbytes):
        flat = t.reshape(-1).view(torch.uint8)
        if flat.data_ptr() % size:
            # a plain buffer (a heap one would have to be made on every rank)
            buf = torch.empty(n, dtype=torch.uint8, device=ctx.device)
            if is_in:
                _copy_in(plan, index, buf)
            if is_out:
                back.append((index, buf))
            flat = buf
        views.append(flat.view(wide))

    def finish():
        for index, buf in back:
            _copy_back(plan, index, buf)
    return views, finish


def round_up(n: int, m: int = ALIGN) -> int:
    return (n + m - 1) // m * m


def launch_size(ctx, n: int, elem_size: int, block=None, programs=None) -> tuple[int, int]:
    """(BLOCK elements, number of programs) for a kernel over `n` elements per program
    loop; block/programs override (tests use them to force several steps)."""
    gpu = ctx.backend == "cuda"
    block = block_size(ctx, elem_size, block)
    check_launch(block, programs)
    # on a GPU shared by several ranks, at most the rank's share of the SMs, so that every
    # rank's programs are resident at once (trident/placement.py)
    limit = programs or (min(GPU_MAX_PROGRAMS, ctx.usable_sms) if gpu else CPU_MAX_PROGRAMS)
    return block, max(1, min(limit, triton.cdiv(n, block)))


def block_size(ctx, elem_size: int, block=None) -> int:
    """launch_size's block: `block`, or the default for elements of `elem_size` bytes."""
    if block is None:
        block = max(16, (GPU_BLOCK_BYTES if ctx.backend == "cuda" else CPU_BLOCK_BYTES)
                    // elem_size)
    return block


def check_launch(block=None, programs=None) -> None:
    """The launch-size overrides' checks: launch_size makes them, and so does a collective
    that launches no kernel (one rank, empty tensors), so that a bad override is rejected
    the same way whether or not a kernel runs."""
    if block is not None and (block < 1 or block & (block - 1)):
        raise ValueError(f"block must be a power of two, got {block}")
    if programs and not 1 <= programs <= device.MAX_PROGRAMS:
        raise ValueError(f"programs must be in 1..{device.MAX_PROGRAMS}, got {programs}")


WARPS = (1, 2, 4, 8, 16, 32)


def kernel_options(ctx, warps=None) -> dict:
    """Launch options: GPU_NUM_WARPS warps per program on GPUs, or `warps` (a knob: fewer
    warps with more programs, or more warps with a larger block; the interpreter ignores
    it, but it is checked there too)."""
    check_warps(warps)
    return {"num_warps": warps or GPU_NUM_WARPS} if ctx.backend == "cuda" else {}


def check_warps(warps=None) -> None:
    """The warps knob's check (kernel_options makes it; so does a call without a kernel)."""
    if warps is not None and warps not in WARPS:
        raise ValueError(f"warps must be one of {WARPS}, got {warps!r}")
