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


@triton.jit
def wait_previous_kernel():
    """Programmatic dependent launch (PDL, sm_90+): wait until the kernel before this one
    in the stream has finished and its memory is visible (griddepcontrol.wait). A kernel
    launched with launch_pdl=True may start while its predecessor still runs: it must call
    this before it reads anything a predecessor may write. Without PDL it returns at once."""
    tl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r", [],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def let_next_kernel_launch():
    """PDL: the next kernel of the stream, if launched with launch_pdl=True, may start now
    (griddepcontrol.launch_dependents; it still waits for this one's end at its
    wait_previous_kernel). A hint: nothing happens without PDL."""
    tl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r", [],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def program_all(pred, THREADS: tl.constexpr = 0):
    """True in every thread of the program when `pred` is true in every thread: a program
    barrier that also votes (bar.red.and.pred), so that a value each warp read on its own
    (a flag it polled) becomes one decision for the whole program. Every thread of the
    program must reach it (never inside a branch that some warps skip).

    THREADS: who "the program" is. 0: every thread of the block (barrier 0). 32: one warp
    (vote.sync, no barrier): a one-warp partition of a warp-specialised Gluon kernel.
    Another multiple of 32: that many threads on barrier 0 -- the default warps of a
    warp-specialised kernel outside its partitions (its worker warps never reach the
    barrier; Triton counts its own barrier 0 there the same way)."""
    return _vote(pred, "and", "all", THREADS)


@triton.jit
def program_any(pred, THREADS: tl.constexpr = 0):
    """True in every thread of the program when `pred` is true in any thread
    (bar.red.or.pred; a program barrier, reached by every thread, as program_all; THREADS
    as there)."""
    return _vote(pred, "or", "any", THREADS)


@triton.jit
def _vote(pred, RED: tl.constexpr, VOTE: tl.constexpr, THREADS: tl.constexpr):
    """program_all (RED "and", VOTE "all") and program_any ("or", "any")."""
    head: tl.constexpr = "{ .reg .pred %pin, %pout; setp.ne.b32 %pin, $1, 0; "
    tail: tl.constexpr = " selp.b32 $0, 1, 0, %pout; }"
    if THREADS == 0:
        r = tl.inline_asm_elementwise(head + "bar.red." + RED + ".pred %pout, 0, %pin;" + tail,
                                      "=r,r", [pred.to(tl.int32)], dtype=tl.int32,
                                      is_pure=False, pack=1)
    elif THREADS == 32:
        r = tl.inline_asm_elementwise(
            head + "vote.sync." + VOTE + ".pred %pout, %pin, 0xffffffff;" + tail, "=r,r",
            [pred.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    else:
        r = tl.inline_asm_elementwise(
            head + "bar.red." + RED + ".pred %pout, 0, $2, %pin;" + tail, "=r,r,r",
            [pred.to(tl.int32), tl.cast(THREADS, tl.int32)], dtype=tl.int32, is_pure=False,
            pack=1)
    return r != 0


@triton.jit
def record_first(word, code, host):
    """Set `word` to `code` if it is 0 (CAS, relaxed, gpu scope) and, in the thread whose
    CAS set it, store `code` into the host mirror `host` (an address; 0: none).

    Every thread that runs it does so on its own: no program barrier and no broadcast,
    unlike a scalar tl.atomic_cas (thread 0 only, then bar.sync), so it is safe in a
    branch that only some warps take (a wait that failed in one warp only)."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred %pset, %phost; .reg .b64 %old; "
        "atom.relaxed.gpu.global.cas.b64 %old, [$1], 0, $2; "
        "setp.eq.s64 %pset, %old, 0; setp.ne.s64 %phost, $3, 0; "
        "and.pred %pset, %pset, %phost; "
        "@%pset st.global.wt.b64 [$3], $2; mov.b64 $0, %old; }",
        "=l,l,l,l", [word, code, host], dtype=tl.int64, is_pure=False, pack=1)
