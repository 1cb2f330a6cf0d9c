"""The GEMM core's host-side helpers that need no kernel (trident/ops/gemm.py re-exports
them): `matmul`'s input checks, whether TMA can take a tensor, the split-K workspace, and
host-made TMA descriptors for the fused ops with the launch-plan fix that keeps only their
base address."""
from __future__ import annotations

import torch

from ._common import DTYPES, outside_graph_pools


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


class _Address:
    """What a host TensorDescriptor of a launch plan points at once the plan is built: the
    base address alone, so that the plan does not keep the caller's tensor alive (Triton's
    launcher reads only `base.data_ptr()` when it encodes the descriptor)."""
    __slots__ = ("ptr", "dtype")

    def __init__(self, t: torch.Tensor):
        self.ptr, self.dtype = t.data_ptr(), t.dtype

    def data_ptr(self) -> int:
        return self.ptr


def host_descriptors(a: torch.Tensor, w: torch.Tensor, bm: int, bn: int, bk: int) -> tuple:
    """Host-made TMA descriptors of a [M, K] and w [N, K] with [bm, bk] and [bn, bk] blocks,
    for `operand` in a fused kernel: the kernel then makes none itself and needs no global
    scratch (which a Launch would keep past the call). Pass the launch that takes them to
    `addresses_only` once it is made."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    return (TensorDescriptor(a, list(a.shape), [a.stride(0), 1], [bm, bk]),
            TensorDescriptor(w, list(w.shape), [w.stride(0), 1], [bn, bk]))


def addresses_only(launch, descriptors) -> None:
    """After `launch` (a triton_launch.Launch) was made with host descriptors: on its fast
    path (GPUs) the descriptors keep only their base address (_Address), so that the plan
    does not keep the call's tensors alive; Triton's launcher reads nothing else of the
    base when it encodes a descriptor. The ordinary path (the CPU emulation) launches
    through the interpreter, which reads the tensor: left as it is."""
    if getattr(launch, "fast", None) is None:
        return
    for d in descriptors:
        if hasattr(d, "block_shape") and isinstance(d.base, torch.Tensor):
            d.base = _Address(d.base)


def tma_compatible(*tensors) -> bool:
    """Whether TMA descriptors can address these 2-D tensors: not empty, rows contiguous,
    base and row stride 16-byte aligned."""
    for t in tensors:
        if not t.numel() or t.stride(1) != 1 or t.data_ptr() % 16 \
                or (t.stride(0) * t.element_size()) % 16:
            return False
    return True


def _bucket_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 1).bit_length()


# (device, stream, partial elements, counters) -> (partials fp32, counters int32); kept
# for the life of the process: plans and captured graphs hold their addresses. `matmul`'s
# only: the fused ops keep theirs with their workspaces (fused_tile.split_buffers).
_split_workspaces: dict = {}


def split_workspace(device: torch.device, partial_elems: int, tiles: int):
    """The split-K workspace of launches on this device's current stream: fp32 partials
    (at least partial_elems) and int32 per-tile arrival counters (at least `tiles`), zeroed
    once when made; the kernel leaves them 0 after every launch (see the module doc).
    Made outside CUDA-graph pools (_common.outside_graph_pools), except for a stream that
    is being captured and has none yet: then from the capture's pool, which lives as long
    as its graph."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream, _bucket_pow2(partial_elems), _bucket_pow2(tiles))
    ws = _split_workspaces.get(key)
    if ws is None:
        def make():
            return (torch.empty(key[2], dtype=torch.float32, device=device),
                    torch.zeros(key[3], dtype=torch.int32, device=device))
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        ws = _split_workspaces[key] = make() if capturing else \
            outside_graph_pools(device, "gemm's split-K workspace", make)
    return ws
