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

A wait also gives up at once, recording PEER_FAILED, when the peer it waits for has
failed: its own error word is set (one of its waits gave up) or it has raised more errors
on the host than this rank has (CTRL_FAILED: a call that failed its checks on that rank
only, so it never launched). Ranks that fail together keep equal counts and do not stop
each other. The peer's control block is found through CTRL_BASES (heap bases, copied into
the block by the host), so `wait` needs nothing but `ctrl`. The peer is polled once every
PEER_POLL rounds of backoff, so that a healthy wait adds no traffic to the link.

A peer in a host-side call. A rank in ctx.barrier() / close() (any host call that first
synchronises the device: context_sync `_barrier`; not reset) has finished its device work
and waits on the host for its peers, so a peer kernel that waits for it waits for a call
that will never come (a rank skipped a collective, or closed early). The host publishes
such a call in CTRL_HOST_CALL (with the number of host exchanges it completed before it);
a wait that polls its peer finds it there and records KIND_HOST_CALL (raised as a
CallMismatch) at once, unless this rank has made that host call itself (CTRL_HOST_DONE: a
stale word not yet cleared) or the flag came meanwhile. The host then joins the peer's
host exchange (context_sync.py), so that every rank raises CallMismatch naming each
rank's call.

The host reads the error word without a device sync: the wait that records the first
error also stores its code into a host word whose address is CTRL_HOST_WORD (pinned
memory on GPUs; plain memory on the CPU emulation, whose kernels run in the host process).
"""
import triton
import triton.language as tl

from ..runtime import control as _control, errors as _errors
from ..runtime._env import INTERPRET
from .rma import translate

if INTERPRET:
    from ._cpu import (backoff, fence_async_proxy, let_next_kernel_launch, load_acquire,
                       program_all, program_any, record_first, timestamp,
                       wait_previous_kernel)
else:
    from ._gpu import (backoff, fence_async_proxy, let_next_kernel_launch, load_acquire,
                       program_all, program_any, record_first, timestamp,
                       wait_previous_kernel)

# Layout of the per-rank control block (int64 words, the first allocation of the heap):
# trident/runtime/control.py, which the host reads too; see there for each word.
CTRL_ERROR = tl.constexpr(_control.CTRL_ERROR)
CTRL_TIMEOUT = tl.constexpr(_control.CTRL_TIMEOUT)
CTRL_EPOCH = tl.constexpr(_control.CTRL_EPOCH)
CTRL_HOST_CALL = tl.constexpr(_control.CTRL_HOST_CALL)
CTRL_HOST_DONE = tl.constexpr(_control.CTRL_HOST_DONE)
CTRL_FLAGS = tl.constexpr(_control.CTRL_FLAGS)
MAX_RANKS = tl.constexpr(_control.MAX_RANKS)
CTRL_VALUE_ERROR = tl.constexpr(_control.CTRL_VALUE_ERROR)
CTRL_VALUE_ARGS = tl.constexpr(_control.CTRL_VALUE_ARGS)
CTRL_FAILED = tl.constexpr(_control.CTRL_FAILED)
CTRL_HOST_WORD = tl.constexpr(_control.CTRL_HOST_WORD)
CTRL_BASES = tl.constexpr(_control.CTRL_BASES)
CTRL_TEXT = tl.constexpr(_control.CTRL_TEXT)
CTRL_TEXT_WORDS = tl.constexpr(_control.CTRL_TEXT_WORDS)
CTRL_WORDS = tl.constexpr(_control.CTRL_WORDS)

_ERROR_FLAG = tl.constexpr(1 << 62)
# what a failed wait records, in bits 48..55 of the error word (trident/runtime/errors.py)
KIND_TIMEOUT = tl.constexpr(_errors.KIND_TIMEOUT)
KIND_PEER_FAILED = tl.constexpr(_errors.KIND_PEER_FAILED)
KIND_MISMATCH = tl.constexpr(_errors.KIND_MISMATCH)
KIND_HOST_CALL = tl.constexpr(_errors.KIND_HOST_CALL)
PEER_POLL = tl.constexpr(32)


@triton.jit
def peer_failed(ctrl, peer):
    """Whether `peer` has failed: its error word is set, or it raised more host errors
    than this rank (see the module docstring)."""
    base = tl.load(ctrl + CTRL_BASES + peer)
    known = base != 0               # no such rank (a wait on a peer index past the world)
    theirs = base.to(tl.pointer_type(tl.int64))
    bad = tl.load(theirs + CTRL_ERROR, mask=known, other=0, volatile=True) != 0
    count = tl.load(theirs + CTRL_FAILED, mask=known, other=0, volatile=True)
    return bad | (count > tl.load(ctrl + CTRL_FAILED, volatile=True))


@triton.jit
def peer_in_host_call(ctrl, peer):
    """Whether `peer` waits in a host-side call that this rank has not made (see "A peer in
    a host-side call"); read with acquire, so that a flag it set before is seen after."""
    base = tl.load(ctrl + CTRL_BASES + peer)
    theirs = base.to(tl.pointer_type(tl.int64))
    call = tl.cast(0, tl.int64)
    if base != 0:
        call = load_acquire(theirs + CTRL_HOST_CALL)
    return (call >> 8) > tl.load(ctrl + CTRL_HOST_DONE, volatile=True)


@triton.jit
def record_error(ctrl, rank, peer, op: tl.constexpr, kind):
    """Record the first error of this rank (the error word, by CAS from 0, and the host's
    mirror of it). Later waits see it and return at once.

    Only the call whose CAS set the word writes the mirror: a failed wait records again
    after the first error (a later wait of the launch returns at once, labelled a
    timeout), and a mirror that took every record named the last one -- a CallMismatch
    found at ARRIVE was raised as a CommTimeout of the DONE wait after it (issue 29)."""
    code = ((tl.cast(kind, tl.int64) << 48) + (tl.cast(op, tl.int64) << 32)
            + (tl.cast(rank, tl.int64) << 16) + peer + _ERROR_FLAG)
    # no scalar tl.atomic_cas here: Triton runs one in thread 0 and broadcasts its result
    # with program barriers, which desynchronise the warps when only some of them record
    # (a branch on a value each warp read on its own); record_first runs in every thread
    # that gets here, with no barrier (issue 29: a wait that failed in some warps only)
    record_first(ctrl + CTRL_ERROR, code.to(tl.int64), tl.load(ctrl + CTRL_HOST_WORD))


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
def signal_ranks(flag, values, rank, world, heap_bases, WP: tl.constexpr):
    """Set `flag` on every rank 0 .. world-1 at once, with release semantics: lane r of
    `values` ([WP], or one value for all; WP >= world, a power of two) is rank r's.

    One program barrier, then one release atomic per lane in a single instruction, so the
    system-scope fence that waits for the acks of this program's earlier stores is paid
    once, where `signal` to each peer in turn pays it once per peer (NVLink round trips
    in series)."""
    rs = tl.arange(0, WP)
    m = rs < world
    tl.debug_barrier()
    remote = translate(flag, rank, tl.where(m, rs, rank), heap_bases)
    values = (tl.full((WP,), 0, tl.int64) + values).to(flag.dtype.element_ty)
    tl.atomic_xchg(remote, values, mask=m, sem="release", scope="sys")


@triton.jit
def other_call(siblings, fp_at, value, fp, SIBLINGS: tl.constexpr,
               SIBLING_STRIDE: tl.constexpr):
    """Whether the peer is in the launch of `value` with another call: one of its
    SIBLINGS flags of this launch (SIBLING_STRIDE words apart from `siblings`, read with
    acquire) holds `value`, and the fingerprint it stored at `fp_at` before its first
    signal is not `fp` (fp = 0: nothing to compare). The slot is read only after such a
    flag (its store happens before): otherwise the peer may be writing it."""
    entered = tl.cast(0, tl.int1)
    for i in tl.static_range(SIBLINGS):
        entered = entered | (load_acquire(siblings + i * SIBLING_STRIDE) == value)
    entered = entered & (fp != 0)
    theirs = tl.load(fp_at, mask=entered, other=0, volatile=True)
    return entered & (theirs != tl.cast(fp, tl.int64))


@triton.jit
def wait(flag, value, ctrl, rank, peer, op: tl.constexpr = 0, THREADS: tl.constexpr = 0,
         siblings=0, fp_at=0, fp=0, SIBLINGS: tl.constexpr = 0,
         SIBLING_STRIDE: tl.constexpr = 0):
    """Wait until the local `flag` >= `value` (acquire, system scope). Returns True if it did.

    `ctrl` is the context's control block (`ctx.ctrl`); `peer` and `op` only label a timeout.
    THREADS: the threads that wait together and vote (program_all): 0, the whole program;
    in a warp-specialised Gluon kernel 32 in a one-warp partition, or the default warps'
    threads outside the partitions (the worker warps would never reach a block barrier).
    SIBLINGS > 0: the peer's other flags of the launch of `value` (`other_call`), polled
    with its control block: a peer that entered this launch with another call's
    fingerprint (a kernel whose first signal is another flag: a push against a pull)
    stops the wait with KIND_MISMATCH (CallMismatch), not at the timeout.
    """
    cur = load_acquire(flag)
    gone = tl.cast(0, tl.int1)      # polled in the loop only: no peer read on a fast wait
    elsewhere = tl.cast(0, tl.int1)
    wrong = tl.cast(0, tl.int1)
    if cur < value:
        failed = tl.load(ctrl + CTRL_ERROR, volatile=True) != 0
        limit = tl.load(ctrl + CTRL_TIMEOUT)
        start = timestamp()
        rounds = 0
        while (cur < value) & (not failed) & (not gone) & (not elsewhere) & (not wrong):
            backoff()
            cur = load_acquire(flag)
            failed = (timestamp() - start) > limit
            rounds += 1
            if rounds % PEER_POLL == 0:     # a peer that failed, or another program here
                gone = peer_failed(ctrl, peer) | (tl.load(ctrl + CTRL_ERROR, volatile=True) != 0)
                # a peer in a host-side call: the flag it may have set before is read again
                elsewhere = peer_in_host_call(ctrl, peer)
                if SIBLINGS > 0:
                    wrong = other_call(siblings, fp_at, value, fp, SIBLINGS, SIBLING_STRIDE)
                cur = load_acquire(flag)
    # The warps of a program poll on their own and may leave the loop at different times,
    # one with the flag, another on a timeout, a failed peer or a peer in a host call. One
    # decision for all (a program barrier that votes): a result that differed between
    # warps sent them down different branches after the wait -- one warp poisoning, the
    # others not, and the program barriers of those branches paired wrongly from then on
    # (issue 29). The barrier also makes program-wide state read after the wait the same
    # in every warp.
    came = program_all(cur >= value, THREADS)
    if not came:
        record_failed_wait(gone, elsewhere, ctrl, rank, peer, op, THREADS, wrong)
    return came


@triton.jit
def record_failed_wait(gone, elsewhere, ctrl, rank, peer, op: tl.constexpr,
                       THREADS: tl.constexpr = 0, wrong=False):
    """Record why a wait of every thread of the program failed (each thread's own `gone`,
    `elsewhere` and `wrong`, voted over THREADS as in `wait`): KIND_TIMEOUT is 0;
    KIND_PEER_FAILED when a warp saw the peer (or this rank) fail; else KIND_MISMATCH when
    it saw the peer in this launch with another call (`other_call`), KIND_HOST_CALL (a
    CallMismatch too) when it waits in a host-side call instead."""
    gone = program_any(gone, THREADS)
    elsewhere = program_any(elsewhere, THREADS)
    wrong = program_any(tl.cast(wrong, tl.int1), THREADS)     # a constant False by default
    kind = tl.cast(gone, tl.int64) * KIND_PEER_FAILED
    if wrong & (not gone):
        kind = tl.cast(KIND_MISMATCH, tl.int64)
    elif elsewhere & (not gone):
        kind = tl.cast(KIND_HOST_CALL, tl.int64)
    record_error(ctrl, rank, peer, op, kind)


@triton.jit
def _all_came(cur, value, mask):
    """One verdict for the program: every word of `cur` where `mask` is >= `value` (a
    reduction over the block, then a vote: a block smaller than the program is held in
    copies, one per warp, each reduced in its warp alone; see ccl/lamport.py `_agree`)."""
    short = tl.max(tl.where(mask & (cur < value), 1, 0), axis=0)
    return program_all(short == 0)


@triton.jit
def wait_group(flags, mask, value, ctrl, rank, peer, op: tl.constexpr = 0, siblings=0,
               fp_at=0, fp=0, SIBLINGS: tl.constexpr = 0, SIBLING_STRIDE: tl.constexpr = 0):
    """`wait` for a group of flags of one peer at once: until the local word at every lane
    of `flags` (a block of pointers, any addresses) where `mask` is set is >= `value`
    (acquire, system scope), one look at all of them per probe. Lanes off the mask are
    read too (point them at any readable word), not waited for. Returns (True if every
    one came, the words as last read: what the signals carried).

    Bounded, and stops on a failed peer, on this rank's error word or on a peer in a
    host-side call exactly as `wait` does, and on another call of the peer in this
    launch where SIBLINGS > 0 (as `wait`'s). Every decision in the loop is voted by the
    whole program, so its warps leave together (the reductions of a block larger than a
    warp hold program barriers: a warp that left alone would pair them wrongly)."""
    cur = load_acquire(flags)
    came = _all_came(cur, value, mask)
    gone = tl.cast(0, tl.int1)
    elsewhere = tl.cast(0, tl.int1)
    wrong = tl.cast(0, tl.int1)
    if not came:
        late = tl.load(ctrl + CTRL_ERROR, volatile=True) != 0
        limit = tl.load(ctrl + CTRL_TIMEOUT)
        start = timestamp()
        rounds = 0
        while (not came) & (not late) & (not gone) & (not elsewhere) & (not wrong):
            backoff()
            rounds += 1
            if rounds % PEER_POLL == 0:     # a peer that failed, or another program here
                gone = program_any(peer_failed(ctrl, peer)
                                   | (tl.load(ctrl + CTRL_ERROR, volatile=True) != 0))
                elsewhere = program_any(peer_in_host_call(ctrl, peer))
                if SIBLINGS > 0:
                    wrong = program_any(other_call(siblings, fp_at, value, fp, SIBLINGS,
                                                   SIBLING_STRIDE))
            # read after the peer's words above: what it signalled before them is seen
            cur = load_acquire(flags)
            came = _all_came(cur, value, mask)
            late = program_any((timestamp() - start) > limit)
        if not came:
            record_failed_wait(gone, elsewhere, ctrl, rank, peer, op, 0, wrong)
    return came, cur


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
