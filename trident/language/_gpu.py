"""GPU implementations of the primitives that need PTX (chosen at import time)."""
import triton
import triton.language as tl


@triton.jit
def timestamp():
    """Nanoseconds from %globaltimer: one clock for all GPUs of a node."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def backoff():
    """Pause between polls of a flag (a short nanosleep keeps NVLink free of poll traffic)."""
    tl.inline_asm_elementwise("nanosleep.u32 64; mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def load_acquire(ptr):
    """Scalar load with acquire semantics at system scope (ld.acquire.sys)."""
    if ptr.dtype.element_ty.primitive_bitwidth == 64:
        return tl.inline_asm_elementwise("ld.acquire.sys.global.b64 $0, [$1];", "=l,l", [ptr],
                                         dtype=ptr.dtype.element_ty, is_pure=False, pack=1)
    else:
        return tl.inline_asm_elementwise("ld.acquire.sys.global.b32 $0, [$1];", "=r,l", [ptr],
                                         dtype=ptr.dtype.element_ty, is_pure=False, pack=1)


@triton.jit
def fence_async_proxy():
    """Order this thread's generic-proxy view of global memory (e.g. data a flag acquired)
    before its later async-proxy accesses (TMA loads): fence.proxy.async.global."""
    tl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, 0;", "=r", [],
                              dtype=tl.int32, is_pure=False, pack=1)
