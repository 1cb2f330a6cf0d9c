"""Device helpers that every collective kernel shares: the launch epoch, per-program
flags, and the reduction of one block.

Epochs. Each collective launch gets an epoch one higher than the previous launch on this
rank (`begin_epoch`: every program reads the counter, the last program to arrive stores
the new value). All ranks launch the same collectives in the same order, so a launch
has the same epoch everywhere. Flags are set to the epoch, never reset, so back-to-back
calls and CUDA-graph replays need no memset and no value from the host.

Flags are per (phase, source rank, program): program p of a launch only waits on
program p of its peers, which keeps the interpreter's one-program-after-another rule
and keeps programs independent on the GPU.

Heap offsets. A tensor the user made on the heap can lie at different offsets on
different ranks (e.g. `out[r*n:(r+1)*n]` as an in-place all_gather input). Kernels that
read or write a peer's copy of such a tensor (pull, two-shot) first publish its byte
offset on every peer (`publish_offset`, released by the ARRIVE notify that follows) and,
after the ARRIVE wait, shift their pointers by the difference (`peer_shift`).

Vector accesses. A shift read at run time has no alignment the compiler can see, so an
access through it is split into scalar ones (a 16-byte vector needs a 16-byte-aligned
address, known at compile time). In the common case every shift is 0 or a multiple of
16 bytes, so the pull kernels check it on the device after the ARRIVE wait (`vec_aligned`,
`peer_shifts`) and branch, once per program, into a copy of their loop compiled with
VEC=True, where each shift is written `shift // V * V` (`vec_shift`, V = 16 bytes in
elements): the compiler then knows the peer's pointer is as aligned as the local one and
emits ld/st.global.v4. Otherwise the same loop runs with VEC=False (scalar, exact for any
shift). The host cannot choose: it does not know the peers' offsets without a host
exchange. The world size is a constexpr (WORLD) in these kernels, so that loops over
ranks unroll: `peer_ptrs` translates every rank's pointer once per program, and
`reduce_peers` issues the loads of all ranks before combining them.

Call fingerprints. Ranks that meet in one launch must have made the same call: a rank
that all-reduces 100 elements while its peer all-reduces 200 would otherwise pair up
with it and return half-reduced data. Each launch carries `fp`, a fingerprint of the call
(kernel, sizes, dtype, reduction: `fingerprint` below, computed once per plan). The
launch's first `notify` stores it beside the flag, in a slot of the launch's parity (a peer
can be one launch ahead, never two); later notifies pass fp=0 and store nothing, so the
slot is written once per launch, before every signal that orders a peer's read of it (a
slot rewritten at a later phase raced with the peer's read after the first: the race
detector found it). `wait_for` compares the peer's fingerprint with its own after
the wait; a difference records CallMismatch in the error word on both ranks of the pair.
The waits' results say whether the launch may trust what peers sent: a program whose
wait failed writes `poison` (NaN, or all bits set for integers) into the outputs it owns,
so a failed call never returns plausible data.

Scratch halves. Kernels that push into a peer's scratch buffer use half `epoch % 2`:
the first or second half of the whole buffer, a fixed byte range whatever the op and its
slot stride (ops of different sizes share a buffer; halves derived from a per-op stride
overlapped, and a rank one launch ahead overwrote slots its peer was still reading).
Every launch waits for at least one signal that each peer sent in that same launch, so
a rank can be at most one launch ahead of any peer: half `epoch % 2` is free again when
launch `epoch + 2` writes it.
"""
import hashlib

import triton
import triton.language as tl

import trident.language as tdl
from trident.runtime.errors import OP_CODES
from trident.trace import device as trd, tags

MAX_PROGRAMS = tl.constexpr(256)      # grid limit of every collective kernel
MAX_RANKS = tl.constexpr(64)
ARRIVE = tl.constexpr(0)              # "I entered this launch": my buffers may be used
DATA = tl.constexpr(1)                # "my data for you is in place"
DONE = tl.constexpr(2)                # "I no longer read or write your buffers"
NUM_PHASES = tl.constexpr(3)
FP_REGION = tl.constexpr(3)           # after the phases: fingerprints by launch parity
NUM_REGIONS = tl.constexpr(3 + 2)     # the flags buffer: phases, then fingerprints
# Op codes that a timed-out wait records (trident/runtime/errors.py OP_NAMES), by collective.
OP_ALL_GATHER = tl.constexpr(OP_CODES["all_gather"])
OP_REDUCE_SCATTER = tl.constexpr(OP_CODES["reduce_scatter"])
OP_ALL_REDUCE = tl.constexpr(OP_CODES["all_reduce"])
OP_ADD_RMSNORM = tl.constexpr(OP_CODES["all_reduce_add_rmsnorm"])
OP_ALL_TO_ALL = tl.constexpr(OP_CODES["all_to_all"])
OP_BROADCAST = tl.constexpr(OP_CODES["broadcast"])
SUM = tl.constexpr(0)
MAX = tl.constexpr(1)
MIN = tl.constexpr(2)


@triton.jit
def begin_epoch(sync):
    """This launch's epoch. `sync` = [epoch of the last launch, programs arrived so far]."""
    epoch = tl.load(sync, volatile=True) + 1
    arrived = tl.atomic_add(sync + 1, 1, sem="acq_rel", scope="gpu")
    if arrived == tl.num_programs(0) - 1:      # every program has read the old epoch
        tl.store(sync + 1, 0)
        tl.store(sync, epoch)
    return epoch


@triton.jit
def scratch_half(scratch, epoch, half):
    """This launch's half of a push scratch buffer of 2 * `half` elements (see "Scratch
    halves" above): a fixed range of the buffer, whatever the op."""
    return scratch + (epoch % 2) * half


@triton.jit
def publish_offset(offsets, my_offset, rank, world_size, heap_bases):
    """Store this launch's tensor offset (bytes from my heap base) into slot `rank` of
    every peer's `offsets`; the ARRIVE notify after it makes it visible."""
    for i in range(1, world_size):
        tdl.store(offsets + rank, my_offset, rank, (rank + i) % world_size, heap_bases)


@triton.jit
def peer_shift(offsets, src, rank, my_offset, WORD: tl.constexpr):
    """Elements (of WORD bytes) between where my tensor lies in my heap and where `src`'s
    lies in its heap (after the ARRIVE wait for `src`). -1 << 40 if the gap is not whole
    elements: then no access lands on the peer's tensor (callers mask with `shift_ok`)."""
    delta = tl.load(offsets + src, volatile=True) - my_offset
    if src == rank:
        delta = delta * 0
    return tl.where(delta % WORD == 0, delta // WORD, -(1 << 40))


@triton.jit
def shift_ok(shift):
    return shift != -(1 << 40)


@triton.jit
def vec_aligned(shift, WORD: tl.constexpr):
    """Whether `shift` (from peer_shift) is a whole number of 16-byte vectors."""
    return shift_ok(shift) & (shift % max(16 // WORD, 1) == 0)


@triton.jit
def vec_shift(shift, WORD: tl.constexpr):
    """`shift`, known by vec_aligned to be whole 16-byte vectors, spelled so that the
    compiler knows it too (x // V * V, not tl.multiple_of: see "Vector accesses")."""
    return shift // max(16 // WORD, 1) * max(16 // WORD, 1)


@triton.jit
def peer_shifts(offsets, rank, my_offset, WORLD: tl.constexpr, WORD: tl.constexpr):
    """peer_shift of every rank, as a tuple indexed by rank (read once per program, after
    the ARRIVE wait), and whether every one of them is whole 16-byte vectors."""
    shifts = ()
    aligned = tl.full([], 1, tl.int1)
    for src in tl.static_range(WORLD):
        shift = peer_shift(offsets, src, rank, my_offset, WORD)
        aligned = aligned & vec_aligned(shift, WORD)
        shifts = shifts + (shift,)
    return shifts, aligned


@triton.jit
def peer_ptrs(ptr, shifts, rank, heap_bases, WORLD: tl.constexpr, WORD: tl.constexpr,
              VEC: tl.constexpr):
    """(pointers, ok): every rank's copy of `ptr` (a tuple indexed by rank, translated once
    per program rather than once per block), and whether it may be accessed (shift_ok).
    VEC: the caller checked (peer_shifts) that every shift is whole 16-byte vectors."""
    ptrs = ()
    oks = ()
    for src in tl.static_range(WORLD):
        shift = shifts[src]
        if VEC:
            shift = vec_shift(shift, WORD)
        ptrs = ptrs + (tdl.translate(ptr + shift, rank, src, heap_bases),)
        oks = oks + (shift_ok(shift),)
    return ptrs, oks


@triton.jit
def _flag(flags, phase, src):
    return flags + (phase * MAX_RANKS + src) * MAX_PROGRAMS + tl.program_id(0)


@triton.jit
def fp_slot(flags, epoch, src, program):
    """Where program `program` of `src` stores the fingerprint of launch `epoch` (a slot per
    launch parity): for kernels whose programs wait on other programs' flags (all_to_all),
    which device.notify and wait_for (always the caller's own program) cannot name."""
    return flags + ((FP_REGION + epoch % 2) * MAX_RANKS + src) * MAX_PROGRAMS + program


@triton.jit
def _fp_slot(flags, epoch, src):
    return fp_slot(flags, epoch, src, tl.program_id(0))


@triton.jit
def same_call(theirs, fp, ok, ctrl, rank, src, op: tl.constexpr):
    """`ok` (a wait for `src` succeeded) and `theirs`, the fingerprint `src` stored before
    the signal waited for, is this call's `fp` (fp=0: not compared); a difference after a
    successful wait records CallMismatch. A kernel that checks more than the fingerprint
    (a count that travelled with the data) passes theirs=0 when that differs."""
    mine = tl.cast(fp, tl.int64)
    same = (theirs == mine) | (mine == 0)
    if ok & (not same):
        tdl.record_error(ctrl, rank, src, op, tdl.KIND_MISMATCH)
    return ok & same


@triton.jit
def notify(flags, phase: tl.constexpr, epoch, rank, peer, heap_bases, fp):
    """Tell `peer` (release, after every store of this program) that this program of
    `rank` reached `phase` of launch `epoch`; the launch's first notify also stores its
    fingerprint `fp` (later ones pass 0)."""
    if fp != 0:
        tdl.store(_fp_slot(flags, epoch, rank), tl.cast(fp, tl.int64), rank, peer,
                  heap_bases)
    tdl.signal(_flag(flags, phase, rank), epoch, rank, peer, heap_bases)


@triton.jit
def wait_for(flags, phase: tl.constexpr, epoch, src, ctrl, rank, op: tl.constexpr, fp):
    """Wait (acquire, bounded) until program of the same id on `src` reached `phase`;
    True if it did, in a call of the same fingerprint `fp` (else CallMismatch is recorded;
    fp=0: not compared)."""
    # polled beside the peer's control block: its flags of the other phases, so that a
    # peer in this launch with another call (a push against a pull: each waits for a
    # flag the other never sets) is a CallMismatch at once, not a timeout
    slot = _fp_slot(flags, epoch, src)
    ok = tdl.wait(_flag(flags, phase, src), epoch, ctrl, rank, src, op, 0,
                  _flag(flags, ARRIVE, src), slot, fp, NUM_PHASES, MAX_RANKS * MAX_PROGRAMS)
    theirs = tl.load(slot, volatile=True)
    return same_call(theirs, fp, ok, ctrl, rank, src, op)


@triton.jit
def notify_all(flags, phase: tl.constexpr, epoch, rank, world_size, heap_bases, fp):
    for i in range(1, world_size):
        notify(flags, phase, epoch, rank, (rank + i) % world_size, heap_bases, fp)


@triton.jit
def wait_all(flags, phase: tl.constexpr, epoch, ctrl, rank, world_size, op: tl.constexpr, fp):
    """wait_for every peer; True if every wait succeeded."""
    ok = tl.cast(1, tl.int1)      # not tl.full([]): Gluon's full needs a layout
    for i in range(1, world_size):
        ok = ok & wait_for(flags, phase, epoch, (rank + i) % world_size, ctrl, rank, op, fp)
    return ok


@triton.jit
def _all_ones(x):
    """All bits set, in x's dtype: NaN in every floating format, -1 as a signed integer."""
    if x.dtype.is_floating():       # via fp32: the interpreter has no bf16 constants
        bad = (x.to(tl.float32) * float("nan")).to(x.dtype)
    elif x.dtype.is_int_unsigned():  # the interpreter's ~ makes a -1 of the type: no uint8
        bad = (x ^ x) - 1
    else:
        bad = ~(x ^ x)
    return bad


@triton.jit
def poison(x, ok):
    """`x` where the launch's waits succeeded (`ok`), else all bits set (`_all_ones`):
    what a failed call leaves in its outputs."""
    return tl.where(ok, x, _all_ones(x))


@triton.jit
def poison_out(out, n, BLOCK: tl.constexpr):
    """Fill this program's blocks of out[:n] with all bits set: the outputs of a launch
    whose first exchange failed, which therefore moved no data."""
    poison_blocks(out, n, tl.program_id(0), tl.num_programs(0), BLOCK)


@triton.jit
def poison_blocks(out, n, first, step, BLOCK: tl.constexpr):
    """Fill blocks first, first + step, ... of out[:n] with all bits set (`_all_ones`)."""
    for blk in range(first, tl.cdiv(n, BLOCK), step):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out + offs, _all_ones(tl.load(out + offs, mask=mask)), mask=mask)


def fingerprint(kernel, *parts) -> int:
    """The call's fingerprint for `fp` (host side, once per plan): the kernel (algorithm
    and op) and `parts` (sizes, dtypes, reduction, root: what every rank's call must
    share). An odd 31-bit value other than 1, so Triton compiles the argument once."""
    name = getattr(getattr(kernel, "fn", kernel), "__qualname__", str(kernel))
    module = getattr(getattr(kernel, "fn", kernel), "__module__", "")
    digest = hashlib.blake2b(repr((module, name, parts)).encode(), digest_size=4).digest()
    return (int.from_bytes(digest, "little") & 0x3FFFFFFF) | 0x40000001


@triton.jit
def to_acc(x):
    """x in the type reductions accumulate in: fp32 for floating types; an integer type
    its own, so that int64 stays exact and sums wrap around as torch's do."""
    if x.dtype.is_floating():
        acc = x.to(tl.float32)
    else:
        acc = x
    return acc


@triton.jit
def combine(acc, x, OP: tl.constexpr):
    """acc (`to_acc`'s type) combined with x under SUM / MAX / MIN."""
    x = to_acc(x)
    if OP == SUM:
        out = acc + x
    elif OP == MAX:
        out = tl.maximum(acc, x)
    else:
        out = tl.minimum(acc, x)
    return out


@triton.jit
def reduce_slots(local, slots, stride, offs, mask, rank, world_size, OP: tl.constexpr):
    """Reduce one block over ranks in rank order 0..world-1 (so every rank that reduces
    the same block gets bit-identical results): rank `rank`'s contribution is read from
    `local + offs`, rank s's from `slots + s * stride + offs`."""
    if rank == 0:
        acc = to_acc(tl.load(local + offs, mask=mask))
    else:
        acc = to_acc(tl.load(slots + offs, mask=mask))
    for src in range(1, world_size):
        if src == rank:
            x = tl.load(local + offs, mask=mask)
        else:
            x = tl.load(slots + src * stride + offs, mask=mask)
        acc = combine(acc, x, OP)
    return acc


@triton.jit
def load_peers(ptrs, oks, offs, mask, WORLD: tl.constexpr, VEC: tl.constexpr):
    """Every rank's copy of one block (`offs`, `mask`; `ptrs`, `oks` from peer_ptrs), all
    loads issued before any is used: a tuple in rank order."""
    xs = ()
    for src in tl.static_range(WORLD):
        if VEC:
            xs = xs + (tl.load(ptrs[src] + offs, mask=mask),)
        else:
            xs = xs + (tl.load(ptrs[src] + offs, mask=mask & oks[src]),)
    return xs


@triton.jit
def store_peers(ptrs, oks, offs, x, mask, WORLD: tl.constexpr, VEC: tl.constexpr):
    """Store one block `x` (`offs`, `mask`) into every rank's copy (`ptrs`, `oks` from
    peer_ptrs), in rank order, nothing waiting on the stores."""
    for dst in tl.static_range(WORLD):
        if VEC:
            tl.store(ptrs[dst] + offs, x, mask=mask)
        else:
            tl.store(ptrs[dst] + offs, x, mask=mask & oks[dst])


@triton.jit
def reduce_peers(ptrs, oks, offs, mask, WORLD: tl.constexpr, OP: tl.constexpr,
                 VEC: tl.constexpr):
    """Reduce one block (`offs`, `mask`) over every rank's copy (`ptrs`, `oks` from
    peer_ptrs) in rank order 0..world-1, so that every rank gets bit-identical results.
    The loads of all ranks are issued before the first combine: a block costs one NVLink
    round trip, not one per rank, and every link carries traffic at once. (The compiler
    hoists independent loads above the combines anyway, so grouping them in the source
    does not bound the registers they take: the host bounds WORLD x BLOCK instead.)"""
    xs = load_peers(ptrs, oks, offs, mask, WORLD, VEC)
    acc = to_acc(xs[0])
    for src in tl.static_range(1, WORLD):
        acc = combine(acc, xs[src], OP)
    return acc


@triton.jit
def exchange(flags, phase: tl.constexpr, epoch, ctrl, rank, world_size, heap_bases,
             op: tl.constexpr, fp, trace_buf, TRACE: tl.constexpr):
    """Tell every peer this program reached `phase`, then wait until all of them did
    (traced as one WAIT). True if every peer came, in a call of fingerprint `fp`."""
    t0 = trd.begin(TRACE)
    notify_all(flags, phase, epoch, rank, world_size, heap_bases, fp)
    ok = wait_all(flags, phase, epoch, ctrl, rank, world_size, op, fp)
    trd.end(trace_buf, t0, tags.WAIT, rank, TRACE)
    return ok


# ---------------------------------------------------------------------------- skeletons
# The steps the collective kernels share, written once; Triton inlines them, so a kernel
# built from them is the kernel that spelled them out (tests/compile/sm90.py compiles it).
# Push (into my slot of every peer's scratch: all_gather, reduce_scatter and broadcast
# push, one-shot all_reduce):
#     epoch, slots, t0 = push_begin(...)        the launch's epoch and scratch half
#     send_blocks / scatter_blocks               my blocks into my slot on every peer
#     ok, t0 = push_exchange(...)                DATA (releases those stores; fp first)
#     gather_slots / reduce_slots_into           the slots into my output, poisoned
#                                                unless every peer's DATA came
# Pull (peers' tensors in place: all_gather and reduce_scatter pull, two-shot all_reduce,
# direct push all_gather):
#     epoch, ok, t0 = arrive(...)                publish my offset, ARRIVE (fp first)
#     ...read or write the peers' tensors, only where ok...
#     depart(...)                                the last exchange (DONE, or DATA), fp=0


@triton.jit
def push_begin(sync, scratch, half, TRACE: tl.constexpr):
    """Push skeleton, step 1: this launch's epoch, its scratch half (`scratch_half`), and
    the SEND phase's trace start."""
    epoch = begin_epoch(sync)
    slots = scratch_half(scratch, epoch, half)
    return epoch, slots, trd.begin(TRACE)


@triton.jit
def send_blocks(dst, src, local, n, rank, world_size, heap_bases, LOCAL: tl.constexpr,
                BLOCK: tl.constexpr):
    """This program's blocks of src[:n] into `dst` (my slot, a local scratch pointer) on
    every peer, loaded once each; LOCAL: stored at `local` too."""
    for blk in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(src + offs, mask=mask)
        for i in range(1, world_size):
            tdl.store(dst + offs, x, rank, (rank + i) % world_size, heap_bases, mask=mask)
        if LOCAL:
            tl.store(local + offs, x, mask=mask)


@triton.jit
def scatter_blocks(dst, src, n, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    """This program's blocks of src[p * n:(p + 1) * n] into `dst` (my slot) on peer p, for
    every peer p."""
    for blk in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        for i in range(1, world_size):
            peer = (rank + i) % world_size
            x = tl.load(src + peer * n + offs, mask=mask)
            tdl.store(dst + offs, x, rank, peer, heap_bases, mask=mask)


@triton.jit
def push_exchange(flags, epoch, ctrl, rank, world_size, heap_bases, op: tl.constexpr, fp,
                  trace_buf, t0, TRACE: tl.constexpr):
    """Push skeleton, step 3: end the SEND trace, exchange DATA (its notify releases this
    program's stores into the peers' slots and carries the call's fingerprint `fp`; the
    wait acquires theirs), start the next phase's trace. Returns (ok, t0)."""
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    ok = exchange(flags, DATA, epoch, ctrl, rank, world_size, heap_bases, op, fp,
                  trace_buf, TRACE)
    return ok, trd.begin(TRACE)


@triton.jit
def gather_slots(out, slots, stride, n, ok, rank, world_size, BLOCK: tl.constexpr):
    """This program's blocks of every peer's slot s into out[s * n:(s + 1) * n], poisoned
    unless `ok`."""
    for blk in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        for i in range(1, world_size):
            src = (rank + i) % world_size
            x = tl.load(slots + src * stride + offs, mask=mask)
            tl.store(out + src * n + offs, poison(x, ok), mask=mask)


@triton.jit
def reduce_slots_into(out, local, slots, stride, n, ok, rank, world_size, OP: tl.constexpr,
                      BLOCK: tl.constexpr):
    """This program's blocks of out[:n]: `reduce_slots` of my `local` block and the peers'
    slots, in rank order, in out's dtype, poisoned unless `ok`."""
    for blk in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        acc = reduce_slots(local, slots, stride, offs, mask, rank, world_size, OP)
        tl.store(out + offs, poison(acc.to(out.dtype.element_ty), ok), mask=mask)


@triton.jit
def arrive(offsets, my_offset, flags, sync, ctrl, heap_bases, trace_buf, rank,
           WORLD: tl.constexpr, op: tl.constexpr, fp, TRACE: tl.constexpr):
    """Pull skeleton, step 1: this launch's epoch, my tensor's heap offset published on
    every peer, then ARRIVE exchanged (its notify releases the offset and carries the
    call's fingerprint `fp`). Returns (epoch, ok, t0): ok, every peer arrived in the same
    call (else touch no peer memory); t0, the next phase's trace start."""
    epoch = begin_epoch(sync)
    publish_offset(offsets, my_offset, rank, WORLD, heap_bases)
    ok = exchange(flags, ARRIVE, epoch, ctrl, rank, WORLD, heap_bases, op, fp, trace_buf,
                  TRACE)
    return epoch, ok, trd.begin(TRACE)


@triton.jit
def depart(flags, phase: tl.constexpr, epoch, ctrl, rank, WORLD: tl.constexpr, heap_bases,
           op: tl.constexpr, trace_buf, t0, tag: tl.constexpr, TRACE: tl.constexpr):
    """Pull skeleton, last step: end the phase's trace (`tag`), then exchange `phase`
    (DONE: I no longer touch your tensor; DATA: my stores into yours are released), fp=0.
    Returns whether every peer came."""
    trd.end(trace_buf, t0, tag, rank, TRACE)
    return exchange(flags, phase, epoch, ctrl, rank, WORLD, heap_bases, op, 0, trace_buf,
                    TRACE)
