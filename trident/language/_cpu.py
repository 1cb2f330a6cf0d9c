"""CPU-emulation implementations of the primitives that need PTX on GPUs.

Under the Triton interpreter a kernel is plain Python, so `timestamp` and `backoff` are
ordinary functions; `load_acquire` is an atomic read on the shared mapping.

`yield_hook` is set while the race detector runs (trident/sanitize/): a program that
backs off in a wait hands the baton to another program of its launch.
"""
import os
import time

import triton
import triton.language as tl


def timestamp():
    """Nanoseconds of a monotonic host clock (the ranks are processes of one host)."""
    return time.monotonic_ns()


yield_hook = None


def backoff():
    """Give the core to another rank: the ranks share few CPU cores."""
    if yield_hook is not None:
        yield_hook()
    os.sched_yield()
    time.sleep(20e-6)


def fence_async_proxy():
    """The interpreter has one proxy: nothing to order."""


@triton.jit
def load_acquire(ptr):
    return tl.atomic_add(ptr, 0, sem="acquire", scope="sys")


def wait_previous_kernel():
    """The interpreter runs launches one after another: nothing to wait for."""


def let_next_kernel_launch():
    """The interpreter has no programmatic dependent launch."""


def program_all(pred, THREADS=0):
    """The interpreter runs a program as one thread: its own value is the program's
    (THREADS, the GPU version's group of threads, changes nothing here)."""
    return pred


def program_any(pred, THREADS=0):
    return pred


@triton.jit
def record_first(word, code, host):
    """Set `word` to `code` if it is 0 and, if this call set it, store `code` into the host
    mirror `host` (an address; 0: none). See the GPU version."""
    old = tl.atomic_cas(word, tl.cast(0, tl.int64), code, sem="relaxed", scope="gpu")
    if (host != 0) & (old == 0):
        tl.store(host.to(tl.pointer_type(tl.int64)), code, cache_modifier=".wt")
    return old
