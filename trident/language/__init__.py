"""Device-side helpers for Triton kernels on the symmetric heap.

    import trident.language as tdl

    @triton.jit
    def kernel(buf, flag, ctrl, heap_bases, rank, world_size, ...):
        tdl.store(buf + offs, x, rank, peer, heap_bases)      # write into peer's heap
        tdl.signal(flag, 1, rank, peer, heap_bases)            # release, system scope
        tdl.wait(flag, 1, ctrl, rank, peer)                    # acquire, bounded

The GPU implementation (PTX) or the CPU-emulation one is chosen when this module is
imported. Rule for kernels that must also run on the CPU emulation: a program may wait
only on work done by programs with a lower id (or by other ranks, or by earlier kernels),
because the interpreter runs a grid's programs one after another. The same rule keeps a
GPU grid free of deadlock when it is larger than what fits on the chip at once.
"""
from .epoch import last_program_out, launch_epoch
from .rma import (atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or,
                  atomic_xchg, atomic_xor, get, load, put, store, translate)
from .sync import (CTRL_WORDS, KIND_MISMATCH, KIND_PEER_FAILED, KIND_TIMEOUT, MAX_RANKS,
                   backoff, barrier, fence_async_proxy, let_next_kernel_launch, load_acquire,
                   peer_failed, record_error, signal, signal_ranks, timestamp, wait,
                   wait_group, wait_previous_kernel)

__all__ = ["translate", "load", "store", "get", "put", "atomic_add", "atomic_cas",
           "atomic_xchg", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor",
           "signal", "signal_ranks", "wait", "wait_group", "barrier", "timestamp", "backoff",
           "load_acquire",
           "fence_async_proxy", "wait_previous_kernel", "let_next_kernel_launch", "record_error", "peer_failed", "KIND_TIMEOUT",
           "KIND_PEER_FAILED", "KIND_MISMATCH",
           "launch_epoch", "last_program_out", "CTRL_WORDS", "MAX_RANKS"]
