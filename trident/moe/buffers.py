"""The buffers of one ExpertParallel: allocated once, reused by every dispatch/combine.

Receive buffers on the symmetric heap (peers write into them), each in two halves picked
by the parity of the op's epoch:

    tokens   [2, world, M, H]   dispatch: token i that rank s sent here, at [par, s, i]
                                 (fp8 dispatch: e4m3 bytes and scales, see fp8_outputs)
    meta     [2, world, M, KP]  its top-k expert ids (int32, -1 padding)
    weights  [2, world, M, KP]  combine: the token's top-k weights (fp32), same rows
    dweights [2, world, M, KP]  the same, when the weights came with dispatch instead
    partial  [2, world, M, H]   combine: sum over this rank's experts of w * expert_y,
                                 written by expert rank s at [par, s, slot of the token on s]
                                 (the high-throughput path's fused launch: by the other
                                 ranks only, this rank's own part is summed in one pass)
    flags    [3, 2, world]      int64, one per (kind, parity, source rank)
    fps      [3, 2, world]      int64: the call fingerprint the source stored beside the
                                 flag of the same index, before it (see "Calls" below)
    slots    [3, 2, world, NS]  int64, low-latency path only: the flags of programs 1.. of
                                 a source (program 0's is `flags`), see "Low latency"
    chunk_flags [2, world, NC]  int64, high-throughput path only (high_throughput.py):
                                 one per (dispatch/combine, source rank, chunk of CHUNK
                                 tokens), value = epoch of the op (monotone: no reset,
                                 no parity needed, see high_throughput.py)

A token goes once to each rank that owns any of its experts (not once per expert); the
receiving rank copies it into the rows of each of its experts. Why two halves: a peer can
start epoch e+1 while this rank still reads epoch e, but it cannot reach e+2 before this
rank has signalled e+1, which this rank does only after it has finished reading e (every
rank signals every rank in every op, also with nothing to send). So flags never need a
reset: a flag carries its epoch (dispatch flags: epoch << 32 | token count).

Calls. Ranks that meet in one dispatch or combine must have made the same call (the same
hidden dim, dtype, experts, top-k, max tokens, path, fp8, weights at dispatch); heaps of
the same size do not say so (bf16 rows of 64 take the bytes of fp32 rows of 32). A
rank stores its call's fingerprint (ccl/device.py "Call fingerprints", made once per
plan) in the peer's `fps` beside each flag it signals (`signal_call(s)`), and a rank that
waits for a flag compares it with its own (`wait_call`): a difference is CallMismatch.
A wait that fails -- a timeout, a peer that failed, another call -- leaves the rank
touching no peer's memory in that launch from then on (on the low-latency path: the
program whose wait failed), and the launch's last program poisons the outputs this rank owns (`poison_outputs`): expert_x (and its fp8 scales) or
combine's out all bits set (NaN), expert_num_tokens -1. The high-throughput path's
chunk flags carry no fingerprint: its dispatch flag and weights flag do, and its combine
follows a dispatch that matched.

Low latency (dispatch.py, combine.py). Every program that sends signals every rank
itself, right after its own stores: one release per program for all ranks at once
(signal_program), no arrival counter and no last program in the chain. Program p of
source s sets (kind, par, s) of slot p on each rank -- program 0 its `flags` word, with
the fingerprint stored before it (so a peer on the high-throughput path, which waits for
that word, finds the other call), programs 1.. their word of `slots` -- to the epoch
(dispatch: epoch << 32 | the source's token count). How many programs signal a kind is
the same on every rank (a function of max_num_tokens and the ExpertParallel's program
cap, both in the fingerprint: plans.py), so a receiver knows which slots to wait for:
wait_programs polls them all in one look (tdl.wait_group), then checks the fingerprint.
Slots carry the epoch, as flags do, and are never reset. A receiver waits for one source
at a time and copies (or sums) what that source sent while the next is still in flight.
The launch's "programs done" counter stays, at GPU scope and after every signal: its
last program only stores the epochs and, after a failure, poisons.

Local buffers (not on the heap): epochs and per-kernel "programs done" counters in
`state`, the high-throughput path's per-expert row counters, where each of our tokens
went (`send_slot`: on both paths a token's row in a destination's receive buffer is its
own index, so no slot is claimed), where each received token's rows are (`token_rows`),
tokens received per source (`recv_count`), and the outputs expert_x /
expert_num_tokens (the low-latency dispatch counts rows straight into the latter, zeroed
by its send program 0 before its signal). Counters are zeroed by the last program of the
kernel that used them, never by a memset; epochs and "programs done" counters work as
trident/language/epoch.py describes.
"""
from __future__ import annotations

import triton
import triton.language as tl
import torch

from .. import language as tdl
from ..ccl.device import poison_blocks, same_call
from ..runtime.errors import OP_CODES
from ..language.sync import CTRL_ERROR

# words of `state` (int64)
DISPATCH_SEND_EPOCH = tl.constexpr(0)
DISPATCH_RECV_EPOCH = tl.constexpr(1)
COMBINE_SEND_EPOCH = tl.constexpr(2)
COMBINE_RECV_EPOCH = tl.constexpr(3)
DISPATCH_SEND_DONE = tl.constexpr(4)     # programs of the kernel that have finished
DISPATCH_RECV_DONE = tl.constexpr(5)
WEIGHTS_DONE = tl.constexpr(6)
COMBINE_SEND_DONE = tl.constexpr(7)
COMBINE_RECV_DONE = tl.constexpr(8)
STATE_WORDS = 16

# kinds of flags
FLAG_DISPATCH = tl.constexpr(0)
FLAG_WEIGHTS = tl.constexpr(1)
FLAG_COMBINE = tl.constexpr(2)

# op codes a failed wait records (trident/runtime/errors.py)
OP_DISPATCH = tl.constexpr(OP_CODES["moe_dispatch"])
OP_COMBINE = tl.constexpr(OP_CODES["moe_combine"])

COUNT_BITS = tl.constexpr(32)            # dispatch flag = epoch << 32 | tokens sent
COUNT_MASK = tl.constexpr(0xFFFFFFFF)

# what one launch of dispatch_kernel / combine_kernel runs (PART): the send half, the
# receive half (split mode), or both, programs [0, send_programs) sending
SEND = tl.constexpr(1)
RECV = tl.constexpr(2)
BOTH = tl.constexpr(3)
# the high-throughput combine's fused launch as it was before its one-pass receive: both
# halves, this rank's own partial sums staged in `partial` as split mode does (A/B only:
# plans.HT_COMBINE_STAGED)
STAGED = tl.constexpr(4)

# the low-latency path: at most this many programs of a rank signal one kind of flag
# (the slots' last dimension is min(this, max_num_tokens * world): plans.py caps its grids)
MAX_SIGNALLERS = 512
COUNT20 = tl.constexpr(0xFFFFF)

# the high-throughput path (high_throughput.py): tokens per chunk, the unit of its
# pipelining (one flag per chunk, destination and op); kinds of chunk flags
CHUNK_TOKENS = 4
CHUNK_DISPATCH = tl.constexpr(0)
CHUNK_COMBINE = tl.constexpr(1)


def chunks(max_num_tokens: int) -> int:
    return -(-max_num_tokens // CHUNK_TOKENS)


@triton.jit
def begin_launch(PDL: tl.constexpr):
    """The first act of every dispatch and combine kernel, both paths, every PART. PDL: the
    kernel was launched with launch_pdl (plans.py `PDL`, ccl/common.py pdl_options), so
    the GPU may start it while the kernel before it in the stream still runs. It waits
    for that kernel first (griddepcontrol.wait), before any global access -- the epochs
    and counters of `state`, the flags, the user's inputs -- so it sees every write of
    the kernels before it as in plain stream order. PTX's griddepcontrol.wait waits
    until the prerequisite grids have *completed* and their memory operations are
    performed and visible, not merely until they triggered (PTX ISA "griddepcontrol";
    CUDA Programming Guide, "Programmatic Dependent Launch and Synchronization": the
    secondary's cudaGridDependencySynchronize waits for the primary's completion and
    flush). So where the trigger sits cannot change what a next kernel that waits so
    (every PDL kernel of trident; a plain launch ignores the trigger) reads, only when
    it is scheduled, and it sits here, at the start: the next kernel's launch hides
    behind this one's whole run. The next kernel is scheduled only once every program
    of this grid has triggered, i.e. is resident, so its programs (held at their own
    wait) cannot keep one of this grid's off the GPU; on a GPU that ranks share, their
    SM room counts against this rank's MPS share (runtime/placement.py), not the
    peer's. Without PDL: nothing."""
    if PDL:
        tdl.wait_previous_kernel()
        tdl.let_next_kernel_launch()


@triton.jit
def senders(send_programs, PART: tl.constexpr):
    """How many of this launch's programs (the first ones) run the send half."""
    if PART == SEND:
        return tl.num_programs(0)
    elif PART == RECV:
        return 0
    else:
        return send_programs


@triton.jit
def signal_call(flags, fps, kind: tl.constexpr, par, world, rank, peer, value, fp,
                heap_bases):
    """Set `peer`'s flag (kind, par, this rank) to `value`, with this call's fingerprint
    `fp` stored beside it first (see "Calls"). One peer: signal_calls below sets every
    rank's at once (one system fence instead of one per rank); combine still signals rank
    by rank, because on one H200 with 2 ranks sharing it its signal_calls form made the
    128-token combine about 5 us slower (docs/latency.md), cause not found."""
    slot = (kind * 2 + par) * world + rank
    tdl.store(fps + slot, tl.cast(fp, tl.int64), rank, peer, heap_bases)
    tdl.signal(flags + slot, value, rank, peer, heap_bases)


@triton.jit
def signal_calls(flags, fps, kind: tl.constexpr, par, world, rank, values, fp, heap_bases,
                 WP: tl.constexpr):
    """Set flag (kind, par, this rank) on every rank, with this call's fingerprint `fp`
    stored beside each first (see "Calls"); lane r of `values` ([WP]) is rank r's flag
    value. The fingerprints go out as one vector store, the flags through
    tdl.signal_ranks: one system-scope fence for all ranks, not one per rank in series."""
    rs = tl.arange(0, WP)
    m = rs < world
    slot = (kind * 2 + par) * world + rank
    tl.store(tdl.translate(fps + slot, rank, tl.where(m, rs, rank), heap_bases),
             tl.full((WP,), 0, tl.int64) + tl.cast(fp, tl.int64), mask=m)
    tdl.signal_ranks(flags + slot, values, rank, world, heap_bases, WP)


@triton.jit
def wait_call(flags, fps, kind: tl.constexpr, par, world, src, value, fp, ctrl, rank,
              op: tl.constexpr):
    """Wait until flag (kind, par, src) >= `value`; True if it came, from the same call
    (else CallMismatch is recorded)."""
    slot = (kind * 2 + par) * world + src
    ok = tdl.wait(flags + slot, value, ctrl, rank, src, op)
    return same_call(tl.load(fps + slot, volatile=True), fp, ok, ctrl, rank, src, op)


@triton.jit
def wait_calls(flags, fps, kind: tl.constexpr, par, world, value, fp, ctrl, rank,
               op: tl.constexpr):
    """wait_call on flag (kind, par, s) of every source rank s, in rank order; True if
    every one came, from the same call."""
    ok = tl.cast(1, tl.int1)
    for s in range(world):
        ok = ok & wait_call(flags, fps, kind, par, world, s, value, fp, ctrl, rank, op)
    return ok


def slot_count(world: int, max_num_tokens: int) -> int:
    """The slots' last dimension: the most programs of a rank that signal one kind."""
    return min(MAX_SIGNALLERS, max_num_tokens * world)


@triton.jit
def signal_program(flags, fps, slots, kind: tl.constexpr, par, world, rank, pid, value, fp,
                   heap_bases, NS: tl.constexpr, WP: tl.constexpr):
    """Program `pid`'s signal of (kind, par, this rank) to every rank, after all its stores:
    program 0 sets its `flags` word (fingerprint first: signal_calls), the others their
    slot (see "Low latency"). One system-scope fence for all ranks."""
    if pid == 0:
        signal_calls(flags, fps, kind, par, world, rank, value, fp, heap_bases, WP)
    else:
        tdl.signal_ranks(slots + ((kind * 2 + par) * world + rank) * NS + pid, value, rank,
                         world, heap_bases, WP)


@triton.jit
def wait_programs(flags, fps, slots, kind: tl.constexpr, par, world, src, n, value, fp, ctrl,
                  rank, op: tl.constexpr, NS: tl.constexpr, NP: tl.constexpr,
                  WATCH: tl.constexpr = -1):
    """Wait until programs 0..n-1 of `src` signalled (kind, par) with at least `value`
    (signal_program; n <= NP, a power of two), all in one look per probe. WATCH >= 0:
    also watch `src`'s flag (WATCH, par) while waiting: one of this launch there with
    another fingerprint is another call, CallMismatch at once (tdl.wait_group's
    SIBLINGS), not the timeout. Returns (came,
    program 0's value, the fingerprint it stored): the caller checks the call with
    same_call(fp_theirs, fp, came, ...) where it first needs to, so that the load's trip
    overlaps its work -- anything it does before must stay in bounds whatever a peer of
    another call sent (counts clamped, ids checked), and its outputs are poisoned if the
    check fails."""
    i = tl.arange(0, NP)
    slot = (kind * 2 + par) * world + src
    ptrs = tl.where(i == 0, flags + slot, slots + slot * NS + i)
    ptrs = tl.where(i < n, ptrs, flags + slot)
    WATCHED: tl.constexpr = WATCH if WATCH >= 0 else 0
    SIBLINGS: tl.constexpr = 1 if WATCH >= 0 else 0
    other = (WATCHED * 2 + par) * world + src
    came, got = tdl.wait_group(ptrs, i < n, value, ctrl, rank, src, op, flags + other,
                               fps + other, fp, SIBLINGS, 1)
    first = tl.sum(tl.where(i == 0, got, 0), axis=0)
    return came, first, tl.load(fps + slot, volatile=True)


@triton.jit
def launch_failed(ctrl):
    """Whether a wait of this rank has failed (its error word is set): read by a launch's
    last program, after every other program's waits (tdl.last_program_out orders them)."""
    return tl.load(ctrl + CTRL_ERROR, volatile=True) != 0


@triton.jit
def poison_outputs(out, n, BLOCK: tl.constexpr):
    """All n elements of `out` (an output of this rank) set to all bits: what the last
    program of a failed launch leaves (one program, so it is slow: an error path)."""
    poison_blocks(out, n, 0, 1, BLOCK)


def block_h(hidden: int, largest: int = 2048) -> int:
    """Columns per step over a row: the power of two (64..largest) wasting the fewest lanes
    on the masked tail, the largest among equals (7168 -> 1024, 2880 -> 1024, 4096 -> 2048)."""
    best = None
    b = 64
    while b <= largest:
        waste = -hidden % b
        if best is None or waste <= best[0]:
            best = (waste, b)
        b *= 2
    return best[1]


class Buffers:
    """Allocates the layout above (heap part: same sizes in the same order on every rank)."""

    def __init__(self, ctx, num_local_experts: int, experts_per_token: int, hidden: int,
                 max_num_tokens: int, dtype: torch.dtype):
        world, M, H = ctx.world_size, max_num_tokens, hidden
        self.kp = triton.next_power_of_2(experts_per_token)
        self.wp = triton.next_power_of_2(world)
        self.cap = M * world
        dev = ctx.device
        self.tokens = ctx.empty(2, world, M, H, dtype=dtype)
        self.meta = ctx.empty(2, world, M, self.kp, dtype=torch.int32)
        self.weights = ctx.empty(2, world, M, self.kp, dtype=torch.float32)
        self.dweights = ctx.empty(2, world, M, self.kp, dtype=torch.float32)
        self.partial = ctx.empty(2, world, M, H, dtype=dtype)
        self.flags = ctx.zeros(3, 2, world, dtype=torch.int64)
        self.chunk_flags = ctx.zeros(2, world, chunks(M), dtype=torch.int64)
        self.fps = ctx.zeros(3, 2, world, dtype=torch.int64)
        self.ns = slot_count(world, M)
        self.slots = ctx.zeros(3, 2, world, self.ns, dtype=torch.int64)
        self._heap = [self.tokens, self.meta, self.weights, self.dweights, self.partial,
                      self.flags, self.chunk_flags, self.fps, self.slots]
        self.state = torch.zeros(STATE_WORDS, dtype=torch.int64, device=dev)
        self.expert_counter = torch.zeros(num_local_experts, dtype=torch.int32, device=dev)
        self.send_slot = torch.full((M, self.wp), -1, dtype=torch.int32, device=dev)
        self.token_rows = torch.full((world, M, self.kp), -1, dtype=torch.int32, device=dev)
        self.recv_count = torch.zeros(self.wp, dtype=torch.int32, device=dev)
        self.expert_x = torch.empty(num_local_experts, self.cap, H, dtype=dtype, device=dev)
        self.expert_num_tokens = torch.zeros(num_local_experts, dtype=torch.int32, device=dev)
        # fp8 dispatch's outputs: made by the first fp8 dispatch (fp8_outputs)
        self.expert_x_fp8 = self.expert_x_scale = None
        self._local_shape = (num_local_experts, self.cap, H)

    def fp8_outputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """expert_x [L, cap, H] float8_e4m3fn and expert_x_scale [L, cap, H/128] fp32 of
        fp8 dispatch (local memory, allocated once). expert_x_scale is column-major in its
        last two dims (a transposed [L, H/128, cap] tensor: DeepEP's layout, which
        DeepGEMM's fp8 grouped GEMMs read without a copy). The e4m3 payload and its scales
        travel in the `tokens` receive buffer, seen as int32 words: H/4 words of bytes
        per row, then the scales after all rows (dispatch.fp8_scale_base); that fits in
        the bf16/fp16/fp32 rows it replaces, so fp8 costs no heap memory."""
        if self.expert_x_fp8 is None:
            L, cap, H = self._local_shape
            dev = self.expert_x.device
            self.expert_x_fp8 = torch.empty(L, cap, H, dtype=torch.float8_e4m3fn, device=dev)
            self.expert_x_scale = torch.empty(L, H // 128, cap, dtype=torch.float32,
                                              device=dev).transpose(1, 2)
        return self.expert_x_fp8, self.expert_x_scale

    @staticmethod
    def heap_bytes(world: int, experts_per_token: int, hidden: int, max_num_tokens: int,
                   dtype: torch.dtype) -> int:
        """Symmetric-heap bytes one ExpertParallel needs (before allocator alignment)."""
        kp = triton.next_power_of_2(experts_per_token)
        esize = torch.empty((), dtype=dtype).element_size()
        rows = 2 * world * max_num_tokens
        return (rows * hidden * esize * 2 + rows * kp * 12 + 2 * 3 * 2 * world * 8
                + 2 * world * chunks(max_num_tokens) * 8
                + 3 * 2 * world * slot_count(world, max_num_tokens) * 8)

    def reset(self) -> None:
        """Back to the state of a fresh object (epochs, flags, counters): used by
        ctx.reset() after a failure, on every rank at once."""
        for t in (self.flags, self.chunk_flags, self.fps, self.slots, self.state,
                  self.expert_counter, self.recv_count, self.expert_num_tokens):
            t.zero_()
        self.send_slot.fill_(-1)
        self.token_rows.fill_(-1)

    def free(self, ctx) -> None:
        for t in reversed(self._heap):
            ctx.free(t)
        self._heap = []
