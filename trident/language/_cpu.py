"""CPU-emulation implementations of the primitives that need PTX on GPUs.

Under the Triton interpreter a kernel is plain Python, so `timestamp` and `backoff` are
ordinary functions; `load_acquire` is an atomic read on the shared mapping.
"""
import os
import time

import triton
import triton.language as tl


def timestamp():
    """Nanoseconds of a monotonic host clock (the ranks are processes of one host)."""
    return time.monotonic_ns()


def backoff():
    """Give the core to another rank: the ranks share few CPU cores."""
    os.sched_yield()
    time.sleep(20e-6)


@triton.jit
def load_acquire(ptr):
    return tl.atomic_add(ptr, 0, sem="acquire", scope="sys")
