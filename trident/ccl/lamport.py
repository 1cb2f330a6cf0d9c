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
every peer's round-e data has come (or its head, from a peer that sends it none: every
kernel waits for a head of every peer, broadcast's root too), so a peer is at most one
round ahead: it writes buffer (e + 1) % 3 while this rank reads e % 3, and buffer e % 3 is
written again only in round e + 3, after this rank's round e + 2 data, long after its
clear. So nothing is reset between calls and a CUDA graph replays the launch as it is.

Layout (one workspace per context, `Lamport`): `data`, 3 buffers x world slots x `cap`
bytes (slot s of a buffer is what rank s sent; a rank never writes its own slot); `heads`,
int64 [3, world, MAX_PROGRAMS]: head (buffer, s, p) = (epoch << 32) | fingerprint that
program p of rank s sent with its data (all_to_all's fold in the count of the pair's
words, so that a count the receiver does not expect is a mismatch). A receiver waits for
its peers' heads too and compares them with its own call's: ranks that made different
calls (sizes, dtypes, ops, algorithms) record CallMismatch, and their outputs are
poisoned. `sync`: [epoch, programs finished].

LL units (all_gather/, broadcast/ and all_to_all/lamport.py: `LL_OPS`): data of any
dtype leaves no value free for a sentinel, so these send 8-byte [payload, flag] units
(`receive_ll` waits for them); lamport_ll.py holds the format, and why a stale unit never
passes for this round's.

The guarantees of the flag protocol hold. Every wait is bounded and checks, every
PEER_POLL rounds, whether a peer failed, waits in a host call, or has entered a launch of
the flag protocol that this rank did not (its epoch in ccl's state is past this rank's:
the ranks called different algorithms), and records the error; a program whose wait
failed poisons what it owns. After a failure `ctx.reset()` refills the buffers.

Programmatic dependent launch (PDL; `pdl`, GPUs of sm_90 and later). A Lamport kernel is
launched with launch_pdl=True, so that the GPU may start it while the kernel before it in
the stream still runs, and hides its launch behind that kernel's tail (a graph of small
calls pays that launch per call). Its first act (`open_round`, PDL=True) is
tdl.wait_previous_kernel(), before it reads anything -- the input, the round counter, the
buffers -- so it sees every write of the kernels before it, as in plain stream order;
then tdl.let_next_kernel_launch() lets the next one start early in its turn. TensorRT-
LLM's all-reduce kernels do the same (cudaGridDependencySynchronize). `PDL = False`
launches them plainly (an A/B knob for bench/lab/kernel_times.py).

The race detector (TRIDENT_SANITIZE, CPU emulation) leaves the buffers and heads out
(`Context.value_synchronised`): a word read as data is ordered after its store by the
value itself, which vector clocks do not model. The rest of a Lamport kernel's accesses
(the round counter, the user's tensors, the flag-protocol epoch it reads) are checked.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import trident.language as tdl
from trident.runtime import _env
from trident.trace import device as trd, tags
from trident.language.sync import (CTRL_ERROR, CTRL_TIMEOUT, KIND_HOST_CALL, KIND_MISMATCH,
                                   KIND_PEER_FAILED, KIND_TIMEOUT, PEER_POLL, peer_failed,
                                   peer_in_host_call, program_any)

from . import common, device

SENTINEL16 = tl.constexpr(-32768)            # 0x8000 as int16
SENTINEL32 = tl.constexpr(-2147450880)       # 0x80008000 as int32
SENTINEL64 = tl.constexpr(-9223231297218904064)   # 0x8000800080008000: an LL unit's fill
FILL32 = -2147450880                         # the host's fill of a buffer, as int32 words
MAX_PROGRAMS = device.MAX_PROGRAMS
# stop reasons folded into a wait's one reduction (bit 0: still pending)
_PENDING = tl.constexpr(1)
_TIMEOUT = tl.constexpr(2)
_GONE = tl.constexpr(4)
_HOST_CALL = tl.constexpr(8)
_MISMATCH = tl.constexpr(16)
# The CPU emulation runs a grid's programs one after another. A flag-protocol launch
# stores its epoch when its last program arrives (device.begin_epoch), so a peer's launch
# of two or more programs, whose first waits for this rank, never showed its epoch there:
# `_stop` counts a launch whose programs have begun arriving as entered. Not on GPUs,
# where a launch's programs are resident together and the last arrives at once (its plain
# stores of the two words are not ordered for a remote reader either).
PROGRAMS_IN_TURN = tl.constexpr(_env.INTERPRET)
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
        ctx.value_synchronised(self.data)     # the race detector leaves them out
        ctx.value_synchronised(self.heads)
        self.reset()

    def reset(self) -> None:
        self.data.view(torch.int32).fill_(FILL32)
        self.heads.zero_()
        self.sync.zero_()

    def slots(self, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
        """The data buffer as integers of `dtype`'s width, and a slot's length in them."""
        size = torch.empty((), dtype=dtype).element_size()
        view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[size]     # 8: LL units
        return self.data.view(view), self.cap // size


def state(ctx, cap: int) -> Lamport:
    return ctx.workspace(("ccl.lamport", cap), lambda c: Lamport(c, cap))


# ---------------------------------------------------------------------------- host
DTYPES = (torch.bfloat16, torch.float16, torch.float32)     # what the sentinel protects
WARPS, BLOCK_BYTES = 4, 2048          # GPU default: 4 warps, 2 KiB a program per step
PDL = True                            # launch with programmatic dependent launch (above)


def pdl(ctx) -> dict:
    """The launch options of a Lamport kernel for PDL (module docstring): its PDL
    constexpr, and launch_pdl where the GPU has it (common.pdl_options, with `PDL`)."""
    return common.pdl_options(ctx, PDL)


def slot_bytes(ctx) -> int:
    """This context's slot size (`capacity` of the agreed smallest heap: every rank's)."""
    return capacity(common.agreed(ctx).heap_size, ctx.world_size)


def workspace(ctx) -> Lamport:
    """The context's Lamport buffers: one set, and one round counter, for every Lamport
    kernel of the context (collectives and fused ops), so the ranks' rounds stay aligned
    across them."""
    return state(ctx, slot_bytes(ctx))


LL_OPS = ("all_gather", "broadcast", "all_to_all")    # those that send LL units


def limit(ctx, op: str) -> int:
    """The bytes per rank (the selector's measure: all_gather's input block,
    reduce_scatter's output block, all_reduce's and broadcast's tensor; all_to_all's
    largest block to or from a peer) a Lamport algorithm of `op` takes: the capacity of a
    slot, half of it in LL units (`LL_OPS`)."""
    return slot_bytes(ctx) // (2 if op in LL_OPS else 1)


def check(ctx, op: str, dtype, nbytes: int, other: str, larger: str, what: str = "",
          floats: bool = True) -> None:
    """The checks of a Lamport algorithm of `op` on a message of `nbytes` per rank (the
    same on every rank, so every rank raises alike): TypeError unless `dtype` is a float
    the sentinel protects (`floats`), naming the algorithm `other` to use instead;
    ValueError past `limit`, naming `larger` (the algorithms, as text). `what`: the
    message, where not the tensor."""
    if floats and dtype not in DTYPES:
        raise TypeError(f"{op} algorithm 'lamport' reduces bfloat16, float16 and float32 "
                        f"(its ready sentinel is a float bit pattern), got {dtype}; use "
                        f"'{other}'")
    cap = limit(ctx, op)
    if nbytes > cap:
        raise ValueError(f"{op} algorithm 'lamport' takes {what}at most {cap} bytes per rank "
                         f"with this heap ({ctx.heap_size} bytes), got {nbytes}; use {larger}")


def launch_size(ctx, word, n: int, block=None, programs=None, warps=None) -> tuple[int, int]:
    """(BLOCK, programs) of a Lamport kernel over `n` elements of the torch dtype `word`
    (common.launch_size). GPUs: WARPS warps and BLOCK_BYTES a program per step unless
    `block`/`warps` say otherwise."""
    size = torch.empty((), dtype=word).element_size()
    if block is None and ctx.backend == "cuda":     # 16 bytes a thread: a short poll
        block = BLOCK_BYTES * (warps or WARPS) // 4 // size
    return common.launch_size(ctx, n, size, block, programs)


def launch(ctx, plan, kernel, before: tuple, word, n: int, fp: tuple, block=None,
           programs=None, warps=None, grid=None, **constexprs) -> None:
    """Add a Lamport kernel's launch: kernel(*before, data, heads, lsync, fsync, ctrl,
    heap_bases, trace_buf, rank, n, slot, fp, WORLD=, ..., BLOCK=, TRACE=), over `n`
    elements of the torch dtype `word` (the buffers are viewed in its width: `slots`);
    fp: the fingerprint's parts besides the kernel. Its size is `launch_size`'s, or
    `grid` programs of `block` (both given: the caller sized it)."""
    from ..trace import kernel_args
    ws = workspace(ctx)
    data, slot = ws.slots(word)
    if grid is None:
        block, grid = launch_size(ctx, word, n, block, programs, warps)
    trace_buf, trace = kernel_args(ctx)
    plan.launch(kernel, (grid,), *before, data, ws.heads, ws.sync, common.state(ctx).sync,
                ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank, n, slot,
                device.fingerprint(kernel, *fp), WORLD=ctx.world_size, BLOCK=block,
                TRACE=trace, **constexprs, **common.kernel_options(ctx, warps or WARPS),
                **pdl(ctx))


# ---------------------------------------------------------------------------- device
@triton.jit
def begin(sync):
    """This launch's round (read by every program first)."""
    return tl.load(sync, volatile=True)


@triton.jit
def open_round(data, lsync, slot, fp, WORLD: tl.constexpr, PDL: tl.constexpr = False):
    """A kernel's start: (its round, the round's buffer index, that buffer's slot 0 in
    `data`'s width, the head every peer's program of this id must send). PDL: the kernel
    was launched with launch_pdl (`pdl`): wait for the kernels before it first, then let
    the next one launch. Nothing of the kernel may be read before this."""
    if PDL:
        tdl.wait_previous_kernel()
        tdl.let_next_kernel_launch()
    epoch = begin(lsync)
    buf = epoch % 3
    return epoch, buf, data + buf * WORLD * slot, head(epoch, fp)


@triton.jit
def sent(heads, buf, expect, rank, heap_bases, trace_buf, t0, WORLD: tl.constexpr,
         TRACE: tl.constexpr):
    """After a program's sends: its head to every peer (the SEND span of the trace ends).
    Returns (its row of this round's heads, ok = True, the next span's start)."""
    send_heads(heads, buf, expect, rank, heap_bases, WORLD)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    t0 = trd.begin(TRACE)
    return heads + buf * WORLD * MAX_PROGRAMS + tl.program_id(0), tl.cast(1, tl.int1), t0


@triton.jit
def end(sync, epoch):
    """Count this program out; the last one stores the next round (every program has read
    this one by then, at its start). acq_rel: each program's read of the round happens
    before the last one's store of the next (the race detector holds a relaxed count to
    that, rightly: relaxed atomics order nothing between programs)."""
    done = tl.atomic_add(sync + 1, 1, sem="acq_rel", scope="gpu")
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
    """A block of the sentinel in the width of `base`'s elements (int16 or int32; int64:
    LL units, whose flag word then holds the sentinel too)."""
    if base.dtype.element_ty.primitive_bitwidth == 16:
        block = tl.full(offs.shape, SENTINEL16, tl.int16)
    elif base.dtype.element_ty.primitive_bitwidth == 32:
        block = tl.full(offs.shape, SENTINEL32, tl.int32)
    else:
        block = tl.full(offs.shape, SENTINEL64, tl.int64)
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
    of another call -- and `stop`, unless everything came: `_unless_came`)."""
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
    return acc, _agree(_block_max(miss | _unless_came(miss, stop)))


@triton.jit
def _block_max(x):
    """The largest element of `x`, a block of one or two dimensions (a GEMM tile)."""
    if len(x.shape) == 2:
        x = tl.max(x, axis=1)
    return tl.max(x, axis=0)


@triton.jit
def _unless_came(miss, stop):
    """`stop` where this thread still waits for something, else 0. What came wins over a
    reason to stop found in the same look (as the flag protocol's wait reads its flag
    again): a peer that has finished this round may already wait in its next host call,
    or be in a later flag-protocol launch, and what it sent stays until this program
    clears it. (Dropped here, before `_agree`: the verdict stays one for all threads.)"""
    return tl.where((miss & _PENDING) != 0, stop, 0)


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
def _stop(ctrl, fsync, heads_row, rank, heap_bases, start, limit, rounds, src,
          WORLD: tl.constexpr, LL: tl.constexpr):
    """Why a wait that has not come should stop (bits, 0: go on): past the timeout; this
    rank failed; and every PEER_POLL rounds (and the first), for each peer whose head has
    not come -- the peers still waited for: one whose head came may rightly have finished
    this round and be in a host call or the next launch already -- that it failed, waits
    in a host call, or is in a flag-protocol launch this rank never entered (its epoch in
    ccl's state is past mine, counting one whose programs have begun arriving on the CPU
    emulation: PROGRAMS_IN_TURN; it made another call). Its epoch is read first, with
    acquire, then its head: a peer past this launch had finished it, so its head would be
    here. With LL only peer `src` is looked at: a program of all_to_all's hears from that
    peer alone (the others' heads of its row never come, rightly)."""
    why = tl.where(tdl.timestamp() - start > limit, _TIMEOUT, 0)
    if rounds % PEER_POLL == 1:
        if tl.load(ctrl + CTRL_ERROR, volatile=True) != 0:
            why = why | _GONE
        mine = tl.load(fsync, volatile=True)
        for i in tl.static_range(1, WORLD):
            peer = (rank + i) % WORLD
            theirs = tdl.load_acquire(tdl.translate(fsync, rank, peer, heap_bases))
            if PROGRAMS_IN_TURN:     # a program of its launch arrived: the launch is entered
                arrived = tdl.load_acquire(tdl.translate(fsync + 1, rank, peer, heap_bases))
                theirs += tl.where(arrived > 0, 1, 0)
            ahead = theirs > mine
            awaited = tl.load(heads_row + peer * MAX_PROGRAMS, volatile=True) == 0
            if LL:
                awaited = awaited & (peer == src)
            if awaited:
                if peer_failed(ctrl, peer):
                    why = why | _GONE
                if peer_in_host_call(ctrl, peer):
                    why = why | _HOST_CALL
                if ahead:
                    why = why | _MISMATCH
    return why


@triton.jit
def _culprit(heads_row, expect, rank, WORLD: tl.constexpr):
    """The peer a failed wait names: the first (after this rank) whose head came from
    another call, else the first whose head has not come, else the next rank."""
    missing = (rank + 1) % WORLD
    wrong = -1
    for i in tl.static_range(WORLD - 1, 0, -1):
        peer = (rank + i) % WORLD
        theirs = tl.load(heads_row + peer * MAX_PROGRAMS, volatile=True)
        if theirs == 0:
            missing = peer
        elif theirs != expect:
            wrong = peer
    return tl.where(wrong >= 0, wrong, missing)


@triton.jit
def _look(base, slot, heads_row, local, offs, mask, expect, src, flag, stop, rank,
          OP: tl.constexpr, WORLD: tl.constexpr, LL: tl.constexpr):
    """One look of a wait: `_probe` (every peer's sentinel words, reduced) or, with LL,
    `_probe_ll` (peer `src`'s LL units of round flag `flag`)."""
    if LL:
        got, seen = _probe_ll(base + src * slot + offs, heads_row + src * MAX_PROGRAMS, mask,
                              flag, expect, stop)
    else:
        got, seen = _probe(base, slot, heads_row, local, offs, mask, expect, stop, rank, OP,
                           WORLD)
    return got, seen


@triton.jit
def _wait(base, slot, heads_row, local, offs, mask, expect, src, flag, ok, ctrl, fsync, rank,
          heap_bases, OP: tl.constexpr, WORLD: tl.constexpr, OPCODE: tl.constexpr,
          LL: tl.constexpr):
    """The bounded wait of `receive` and `receive_ll` (`_look` says what it waits for):
    (what the last look got; whether it came: never where `ok` is not). A wait that fails
    records why."""
    got, seen = _look(base, slot, heads_row, local, offs, mask, expect, src, flag, 0, rank, OP,
                      WORLD, LL)
    if not ok:
        seen = seen | _GONE
    if (seen & _PENDING) != 0:
        start = tdl.timestamp()
        limit = tl.load(ctrl + CTRL_TIMEOUT)
        rounds = 0
        while seen == _PENDING:
            tdl.backoff()
            rounds += 1
            why = _stop(ctrl, fsync, heads_row, rank, heap_bases, start, limit, rounds, src,
                        WORLD, LL)
            got, seen = _look(base, slot, heads_row, local, offs, mask, expect, src, flag, why,
                              rank, OP, WORLD, LL)
    came = seen == 0
    if (not came) & ok:
        kind = tl.cast(KIND_TIMEOUT, tl.int64)
        if (seen & _GONE) != 0:
            kind = tl.cast(KIND_PEER_FAILED, tl.int64)
        elif (seen & _MISMATCH) != 0:
            kind = tl.cast(KIND_MISMATCH, tl.int64)
        elif (seen & _HOST_CALL) != 0:
            kind = tl.cast(KIND_HOST_CALL, tl.int64)
        if LL:                          # the peer waited for (`_stop`)
            culprit = src
        else:
            culprit = _culprit(heads_row, expect, rank, WORLD)
        tdl.record_error(ctrl, rank, culprit, OPCODE, kind)
    return got, came


@triton.jit
def receive(base, slot, heads_row, local, offs, mask, expect, ok, ctrl, fsync, rank,
            heap_bases, OP: tl.constexpr, WORLD: tl.constexpr, OPCODE: tl.constexpr):
    """Wait (bounded) until every peer's words of this block (`base + src * slot + offs`)
    and its head have come, then clear those words. Returns (the block reduced over ranks
    in rank order, in fp32; whether it may be trusted). `ok`: the program's earlier waits
    succeeded (else nothing is awaited, and the result is not trusted)."""
    acc, came = _wait(base, slot, heads_row, local, offs, mask, expect, 0, 0, ok, ctrl, fsync,
                      rank, heap_bases, OP, WORLD, OPCODE, False)
    clear = _fill(base, offs)
    for src in tl.static_range(WORLD):          # back to the sentinel, for round e + 3
        tl.store(base + src * slot + offs, clear, mask=mask & (src != rank))
    return acc, came & ok



@triton.jit
def receive_blocks(out, src, base, slot, heads_row, expect, ok, ctrl, fsync, rank, heap_bases,
                   n, OP: tl.constexpr, WORLD: tl.constexpr, OPCODE: tl.constexpr,
                   BLOCK: tl.constexpr):
    """This program's blocks of out[:n] (grid-stride): this rank's own block from `src` and
    the peers' words of it (`receive`), reduced in rank order, poisoned from the first wait
    that failed. Returns whether every wait came (and `ok` did)."""
    for blk in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        local = canonical(tl.load(src + offs, mask=mask))
        acc, ok = receive(base, slot, heads_row, local, offs, mask, expect, ok, ctrl, fsync,
                          rank, heap_bases, OP, WORLD, OPCODE)
        tl.store(out + offs, device.poison(acc.to(out.dtype.element_ty), ok), mask=mask)
    return ok

# ---------------------------------------------------------------------------- LL units
# (the unit format and its packing: lamport_ll.py; the wait is the one above)
@triton.jit
def _probe_ll(units_ptr, head_ptr, mask, flag, expect, stop):
    """One look at a peer's LL units of this block and its head: (their payload lanes,
    int32; a verdict as `_probe`'s: _PENDING -- a unit without this round's flag, or no
    head --, _MISMATCH, `stop`). Each unit is one 8-byte load, so its payload is the one
    its flag came with."""
    units = tl.load(units_ptr, mask=mask, other=0, volatile=True)
    theirs = tl.load(head_ptr, volatile=True)
    pending = (((units >> 32).to(tl.int32) != flag) & mask) | (theirs == 0)
    wrong = (theirs != 0) & (theirs != expect)
    miss = tl.where(pending, _PENDING, 0) | tl.where(wrong, _MISMATCH, 0)
    return units.to(tl.int32), _agree(tl.max(miss | _unless_came(miss, stop), axis=0))


@triton.jit
def receive_ll(base, slot, heads_row, src, offs, mask, flag, expect, ok, ctrl, fsync, rank,
               heap_bases, WORLD: tl.constexpr, OPCODE: tl.constexpr):
    """Wait (bounded) until peer `src`'s LL units of this block (`base + src * slot +
    offs`, int64) carry `flag` and its head has come, then clear them (back to the fill,
    for round e + 3). Returns (their payload lanes, int32; whether they may be trusted);
    `ok` as receive's."""
    lanes, came = _wait(base, slot, heads_row, offs, offs, mask, expect, src, flag, ok, ctrl,
                        fsync, rank, heap_bases, 0, WORLD, OPCODE, True)
    tl.store(base + src * slot + offs, _fill(base, offs), mask=mask)
    return lanes, came & ok


@triton.jit
def receive_head(base, slot, heads_row, src, offs, flag, expect, ok, ctrl, fsync, rank,
                 heap_bases, WORLD: tl.constexpr, OPCODE: tl.constexpr):
    """Wait (bounded, as receive_ll) for peer `src`'s head alone, from a peer that sends
    this program no units (broadcast's non-root peers): that it made this call, and that
    it has entered this round (the rounds stay aligned). `offs`: a block of the program's
    shape. Returns `ok` and whether it came."""
    _, came = _wait(base, slot, heads_row, offs, offs, offs < 0, expect, src, flag, ok, ctrl,
                    fsync, rank, heap_bases, 0, WORLD, OPCODE, True)
    return came & ok


@triton.jit
def clear_heads(heads_row, rank, WORLD: tl.constexpr):
    """Back to 0: this program's heads of this round (after its last receive)."""
    for src in tl.static_range(WORLD):
        if src != rank:
            tl.store(heads_row + src * MAX_PROGRAMS, tl.cast(0, tl.int64))
