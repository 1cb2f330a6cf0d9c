"""Signals, bounded waits, the cross-rank device barrier, and timestamps.

Memory ordering: `signal` makes every store the calling program issued before it
visible to `peer` before the flag changes (program barrier, then an atomic with release
semantics at system scope). `wait` reads the flag with acquire semantics at system
scope, so loads after it see the data written before the matching signal.

A program's warps leave `wait` together (a program barrier ends it), so values read
after a wait agree across warps.

Every wait is bounded: past the context's timeout it records (op, rank, peer) in the
rank's error word and returns False; the host then raises trident.CommTimeout. Once the
error word is set, later waits return at once, so a missing peer costs one timeout.
"""
import triton
import triton.language as tl

from .._env import INTERPRET
from .rma import translate

if INTERPRET:
    from ._cpu import backoff, fence_async_proxy, load_acquire, timestamp
else:
    from ._gpu import backoff, fence_async_proxy, load_acquire, timestamp

# Layout of the per-rank control block (int64 words, the first allocation of the heap).
CTRL_ERROR = tl.constexpr(0)        # 0, or the first timeout's encode_timeout(...)
CTRL_TIMEOUT = tl.constexpr(1)      # wait limit in ns
CTRL_EPOCH = tl.constexpr(2)        # device-barrier epoch of this rank
CTRL_FLAGS = tl.constexpr(8)        # device-barrier flags, one per source rank
MAX_RANKS = tl.constexpr(64)
# The first bad input value a kernel found (e.g. an MoE expert id out of range): a kind
# (trident/errors.py VALUE_ERRORS) set by a CAS from 0, then four words that say where.
# Bad values are dropped by the kernel; the host raises ValueError at the next sync.
CTRL_VALUE_ERROR = tl.constexpr(8 + 64)
CTRL_VALUE_ARGS = tl.constexpr(8 + 64 + 1)
CTRL_WORDS = tl.constexpr(8 + 64 + 8)

_ERROR_FLAG = tl.constexpr(1 << 62)


@triton.jit
def signal(flag, value, rank, peer, heap_bases, add: tl.constexpr = False):
    """Set (or, with add=True, add to) `peer`'s copy of `flag`, with release semantics.

    All stores this program made before the call are visible on `peer` first.
    """
    tl.debug_barrier()
    remote = translate(flag, rank, peer, heap_bases)
    if add:
        tl.atomic_add(remote, value, sem="release", scope="sys")
    else:
        tl.atomic_xchg(remote, value, sem="release", scope="sys")


@triton.jit
def wait(flag, value, ctrl, rank, peer, op: tl.constexpr = 0):
    """Wait until the local `flag` >= `value` (acquire, system scope). Returns True if it did.

    `ctrl` is the context's control block (`ctx.ctrl`); `peer` and `op` only label a timeout.
    """
    cur = load_acquire(flag)
    if cur < value:
        failed = tl.load(ctrl + CTRL_ERROR, volatile=True) != 0
        limit = tl.load(ctrl + CTRL_TIMEOUT)
        start = timestamp()
        while (cur < value) & (not failed):
            backoff()
            cur = load_acquire(flag)
            failed = (timestamp() - start) > limit
        if cur < value:
            code = ((tl.cast(op, tl.int64) << 32) + (tl.cast(rank, tl.int64) << 16) + peer
                    + _ERROR_FLAG)
            # cmp spelled as int64: the interpreter sizes the CAS by cmp's type. Scalars are
            # made with tl.cast, not tl.full([]): Gluon's full needs a layout (see gluon.py)
            tl.atomic_cas(ctrl + CTRL_ERROR, tl.cast(0, tl.int64), code.to(tl.int64),
                          sem="relaxed", scope="gpu")
    # The warps of a program poll on their own and may leave the loop at different times
    # (or one may skip it). Leave together, so that program-wide state read after the
    # wait (an epoch, a counter) is the same in every warp.
    tl.debug_barrier()
    return cur >= value


@triton.jit
def barrier(ctrl, rank, world_size, heap_bases):
    """Cross-rank barrier for one program of a kernel. No flag reset is needed: each call
    raises the rank's epoch, and each peer waits for its slot to reach that epoch, so the
    same kernel can be replayed from a CUDA graph."""
    tl.debug_barrier()          # every warp reads the epoch the last barrier stored
    epoch = tl.load(ctrl + CTRL_EPOCH) + 1
    tl.debug_barrier()          # ...before any warp's store of the new one
    tl.store(ctrl + CTRL_EPOCH, epoch)
    for peer in range(world_size):
        signal(ctrl + CTRL_FLAGS + rank, epoch, rank, peer, heap_bases)
    for peer in range(world_size):
        wait(ctrl + CTRL_FLAGS + peer, epoch, ctrl, rank, peer, 1)
