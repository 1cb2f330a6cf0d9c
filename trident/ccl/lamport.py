"""The Lamport protocol: data and readiness in one store, for small messages.

A flag protocol (device.py) costs a call two trips of ordering on top of the data: the
sender's release (a system-scope fence that waits for its NVLink stores to be acknowledged)
and the flag's own trip. Here the data is its own flag. Every word of the receive buffers
holds a value senders never write (the sentinel) until a sender's store replaces it, so a
receiver polls the payload itself until no word it needs is the sentinel: one trip across
NVLink, no fence, no flag, no barrier kernel (the scheme of TensorRT-LLM's and SGLang's
one-shot all-reduce).

The sentinel is 0x8000 in every 16-bit half of a buffer word: -0.0 in bf16 and fp16, and as
an fp32 the denormal -4.59e-41 (0x80008000). Senders write +0.0 in its place (a 16-bit -0.0
becomes +0.0; that one fp32 denormal becomes +0.0, as a flush-to-zero would), so a message
of 16- or 32-bit floats never carries it, and one buffer serves both widths: a receiver
compares each element in its own width. NaN, our poison, is not the sentinel.

Rounds. A context's Lamport launches are numbered (`epoch`, this state's own counter: all
ranks make the same calls, so a launch has the same epoch everywhere) and use buffer
`epoch % 3` of three. Each program clears (back to the sentinel) exactly the words it has
read, right after reading them, in the same launch. A rank reaches round e + 1 only once
every peer's round-e data has come, so a peer is at most one round ahead: it writes buffer
(e + 1) % 3 while this rank reads e % 3, and buffer e % 3 is written again only in round
e + 3, after this rank's round e + 2 data, long after its clear. So nothing is reset
between calls and a CUDA graph replays the launch as it is.

Layout (one workspace per context, `Lamport`): `data`, 3 buffers x world slots x `cap`
bytes (slot s of a buffer is what rank s sent; a rank never writes its own slot); `heads`,
int64 [3, world, MAX_PROGRAMS]: head (buffer, s, p) = (epoch << 32) | fingerprint that
program p of rank s sent with its data. A receiver waits for its peers' heads too and
compares them with its own call's: ranks that made different calls (sizes, dtypes, ops,
algorithms) record CallMismatch, and their outputs are poisoned. `sync`: [epoch, programs
finished].

The guarantees of the flag protocol hold. Every wait is bounded and checks, every
PEER_POLL rounds, whether a peer failed, waits in a host call, or has entered a launch of
the flag protocol that this rank did not (its epoch in ccl's state is past this rank's:
the ranks called different algorithms), and records the error; a program whose wait
failed poisons what it owns. After a failure `ctx.reset()` refills the buffers.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import trident.language as tdl
from trident.language.sync import (CTRL_ERROR, CTRL_TIMEOUT, KIND_HOST_CALL, KIND_MISMATCH,
                                   KIND_PEER_FAILED, KIND_TIMEOUT, PEER_POLL, peer_failed,
                                   peer_in_host_call, program_any)

from . import device

SENTINEL16 = tl.constexpr(-32768)            # 0x8000 as int16
SENTINEL32 = tl.constexpr(-2147450880)       # 0x80008000 as int32
FILL32 = -2147450880                         # the host's fill of a buffer, as int32 words
MAX_PROGRAMS = device.MAX_PROGRAMS
# stop reasons folded into a wait's one reduction (bit 0: still pending)
_PENDING = tl.constexpr(1)
_TIMEOUT = tl.constexpr(2)
_GONE = tl.constexpr(4)
_HOST_CALL = tl.constexpr(8)
_MISMATCH = tl.constexpr(16)
# Per-rank receive bytes per slot, at most (a rank keeps 3 * world slots) and at most the
# heap / (32 * world): 12 MiB of a 1 GiB heap at 4 ranks.
CAP_BYTES = 1 << 20


def capacity(heap_size: int, world_size: int) -> int:
    """Bytes a Lamport message may have per rank (`Lamport.cap`): the same on every rank,
    since `heap_size` is the agreed smallest heap (common.Agreed)."""
    room = max(heap_size // (32 * world_size), 1 << 12)
    return min(CAP_BYTES, 1 << (room.bit_length() - 1))


class Lamport:
    """The protocol's buffers of one context (a workspace: made on every rank at the same
    call). `reset()` (ctx.reset) refills them: a failed call may have left words behind."""

    def __init__(self, ctx, cap: int):
        w = ctx.world_size
        self.cap = cap
        self.data = ctx.empty(3 * w * cap, dtype=torch.uint8)
        self.heads = ctx.empty(3 * w * MAX_PROGRAMS, dtype=torch.int64)
        self.sync = ctx.empty(2, dtype=torch.int64)
        self.reset()

    def reset(self) -> None:
        self.data.view(torch.int32).fill_(FILL32)
        self.heads.zero_()
        self.sync.zero_()

    def slots(self, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
        """The data buffer as integers of `dtype`'s width, and a slot's length in them."""
        size = torch.empty((), dtype=dtype).element_size()
        view = {2: torch.int16, 4: torch.int32}[size]
        return self.data.view(view), self.cap // size


def state(ctx, cap: int) -> Lamport:
    return ctx.workspace(("ccl.lamport", cap), lambda c: Lamport(c, cap))


# ---------------------------------------------------------------------------- device
@triton.jit
def begin(sync):
    """This launch's round (read by every program first)."""
    return tl.load(sync, volatile=True)


@triton.jit
def end(sync, epoch):
    """Count this program out; the last one stores the next round (every program has read
    this one by then, at its start)."""
    done = tl.atomic_add(sync + 1, 1, sem="relaxed", scope="gpu")
    if done == tl.num_programs(0) - 1:
        tl.store(sync + 1, 0)
        tl.store(sync, epoch + 1)


@triton.jit
def sentinel(bits):
    """The sentinel in the width of `bits` (int16 or int32)."""
    if bits.dtype.primitive_bitwidth == 16:
        s = SENTINEL16
    else:
        s = SENTINEL32
    return s


@triton.jit
def _fill(base, offs):
    """A block of the sentinel in the width of `base`'s elements (int16 or int32)."""
    if base.dtype.element_ty.primitive_bitwidth == 16:
        block = tl.full(offs.shape, SENTINEL16, tl.int16)
    else:
        block = tl.full(offs.shape, SENTINEL32, tl.int32)
    return block


@triton.jit
def to_words(x):
    """`x` (bf16, fp16 or fp32) as integers of its width, the sentinel replaced by +0.0."""
    if x.dtype.primitive_bitwidth == 16:
        bits = x.to(tl.int16, bitcast=True)
    else:
        bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits == sentinel(bits), 0, bits)


@triton.jit
def canonical(x):
    """`x` as it travels (to_words): what a rank reduces its own block as, so that every
    rank reduces the same values (max/min would otherwise tell -0.0 from +0.0 on one rank)."""
    return to_words(x).to(x.dtype, bitcast=True)


@triton.jit
def head(epoch, fp):
    """What a program sends as its head: the round and the call's fingerprint (never 0)."""
    return ((tl.cast(epoch, tl.int64) & 0x7FFFFFFF) << 32) | tl.cast(fp, tl.int64)


@triton.jit
def send(slot, words, offs, mask, rank, heap_bases, WORLD: tl.constexpr):
    """Store `words` at `slot + offs` (my slot of this round's buffer) on every peer."""
    for i in tl.static_range(1, WORLD):
        tdl.store(slot + offs, words, rank, (rank + i) % WORLD, heap_bases, mask=mask)


@triton.jit
def send_heads(heads, buf, value, rank, heap_bases, WORLD: tl.constexpr):
    """This program's head, into my row of buffer `buf`'s heads on every peer."""
    mine = heads + (buf * WORLD + rank) * MAX_PROGRAMS + tl.program_id(0)
    for i in tl.static_range(1, WORLD):
        tdl.store(mine, value, rank, (rank + i) % WORLD, heap_bases)


@triton.jit
def _probe(base, slot, heads_row, local, offs, mask, expect, stop, rank, OP: tl.constexpr,
           WORLD: tl.constexpr):
    """One look at every peer's words of this block and head: (the block reduced over
    ranks in rank order, as far as it came, and a verdict the same in every thread
    (`_agree`): the bits _PENDING -- a word or head not there yet --, _MISMATCH -- a head
    of another call -- and `stop`)."""
    miss = tl.zeros_like(offs)
    for src in tl.static_range(WORLD):
        peer = src != rank
        bits = tl.load(base + src * slot + offs, mask=mask & peer, other=0, volatile=True)
        theirs = tl.load(heads_row + src * MAX_PROGRAMS, mask=peer, other=expect,
                         volatile=True)
        x = tl.where(peer, bits.to(local.dtype, bitcast=True), local)
        pending = ((bits == sentinel(bits)) & mask) | (theirs == 0)
        wrong = (theirs != 0) & (theirs != expect)
        miss = miss | tl.where(pending, _PENDING, 0) | tl.where(wrong, _MISMATCH, 0)
        if src == 0:
            acc = x.to(tl.float32)
        else:
            acc = device.combine(acc, x, OP)
    return acc, _agree(tl.max(miss | stop, axis=0))


@triton.jit
def _agree(mine):
    """One verdict for the whole program: the bits that any thread's `mine` has. A block
    smaller than the program's threads is held in copies, one per warp, and tl.max reduces
    each copy in its warp without a program barrier; warps that decided apart left the
    wait apart, and one cleared words another was still polling (on one H200: timeouts,
    and stale words read as data, in 1 of some 30 rounds). Program barriers that vote
    (program_any), which every thread reaches: two on the common path."""
    seen = tl.where(program_any((mine & _PENDING) != 0), _PENDING, 0)
    if program_any(mine > _PENDING):
        seen = seen | tl.where(program_any((mine & _TIMEOUT) != 0), _TIMEOUT, 0)
        seen = seen | tl.where(program_any((mine & _GONE) != 0), _GONE, 0)
        seen = seen | tl.where(program_any((mine & _HOST_CALL) != 0), _HOST_CALL, 0)
        seen = seen | tl.where(program_any((mine & _MISMATCH) != 0), _MISMATCH, 0)
    return seen


@triton.jit
def _stop(ctrl, fsync, heads_row, rank, heap_bases, start, limit, rounds, WORLD: tl.constexpr):
    """Why a wait that has not come should stop (bits, 0: go on): past the timeout; every
    PEER_POLL rounds (and the first), this rank or a peer failed, a peer waits in a host
    call, or a peer whose head has not come is in a flag-protocol launch this rank never
    entered (its epoch in ccl's state is past mine: it made another call). Only such a
    peer: one whose head came may rightly be in the next call already. Its epoch is read
    first, with acquire, then its head: a peer past this launch had finished it, so its
    head would be here."""
    why = tl.where(tdl.timestamp() - start > limit, _TIMEOUT, 0)
    if rounds % PEER_POLL == 1:
        if tl.load(ctrl + CTRL_ERROR, volatile=True) != 0:
            why = why | _GONE
        mine = tl.load(fsync, volatile=True)
        for i in tl.static_range(1, WORLD):
            peer = (rank + i) % WORLD
            if peer_failed(ctrl, peer):
                why = why | _GONE
            if peer_in_host_call(ctrl, peer):
                why = why | _HOST_CALL
            if tdl.load_acquire(tdl.translate(fsync, rank, peer, heap_bases)) > mine:
                if tl.load(heads_row + peer * MAX_PROGRAMS, volatile=True) == 0:
                    why = why | _MISMATCH
    return why


@triton.jit
def _first_missing(heads_row, rank, WORLD: tl.constexpr):
    """The peer a failed wait names: the first (after this rank) whose head has not come,
    else the next rank."""
    who = (rank + 1) % WORLD
    for i in tl.static_range(WORLD - 1, 0, -1):
        peer = (rank + i) % WORLD
        if tl.load(heads_row + peer * MAX_PROGRAMS, volatile=True) == 0:
            who = peer
    return who


@triton.jit
def receive(base, slot, heads_row, local, offs, mask, expect, ok, ctrl, fsync, rank,
            heap_bases, OP: tl.constexpr, WORLD: tl.constexpr, OPCODE: tl.constexpr):
    """Wait (bounded) until every peer's words of this block (`base + src * slot + offs`)
    and its head have come, then clear those words. Returns (the block reduced over ranks
    in rank order, in fp32; whether it may be trusted). `ok`: the program's earlier waits
    succeeded (else nothing is awaited, and the result is not trusted)."""
    acc, seen = _probe(base, slot, heads_row, local, offs, mask, expect, 0, rank, OP, WORLD)
    if not ok:
        seen = seen | _GONE
    if (seen & _PENDING) != 0:
        start = tdl.timestamp()
        limit = tl.load(ctrl + CTRL_TIMEOUT)
        rounds = 0
        while seen == _PENDING:
            tdl.backoff()
            rounds += 1
            why = _stop(ctrl, fsync, heads_row, rank, heap_bases, start, limit, rounds, WORLD)
            acc, seen = _probe(base, slot, heads_row, local, offs, mask, expect, why, rank,
                               OP, WORLD)
    came = seen == 0
    if (not came) & ok:
        kind = tl.cast(KIND_TIMEOUT, tl.int64)
        if (seen & _GONE) != 0:
            kind = tl.cast(KIND_PEER_FAILED, tl.int64)
        elif (seen & _MISMATCH) != 0:
            kind = tl.cast(KIND_MISMATCH, tl.int64)
        elif (seen & _HOST_CALL) != 0:
            kind = tl.cast(KIND_HOST_CALL, tl.int64)
        tdl.record_error(ctrl, rank, _first_missing(heads_row, rank, WORLD), OPCODE, kind)
    clear = _fill(base, offs)
    for src in tl.static_range(WORLD):          # back to the sentinel, for round e + 3
        tl.store(base + src * slot + offs, clear, mask=mask & (src != rank))
    return acc, came & ok


@triton.jit
def clear_heads(heads_row, rank, WORLD: tl.constexpr):
    """Back to 0: this program's heads of this round (after its last receive)."""
    for src in tl.static_range(WORLD):
        if src != rank:
            tl.store(heads_row + src * MAX_PROGRAMS, tl.cast(0, tl.int64))
