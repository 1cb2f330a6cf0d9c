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

Scratch halves. Kernels that push into a peer's scratch buffer use half `epoch % 2`:
the first or second half of the whole buffer, a fixed byte range whatever the op and its
slot stride (ops of different sizes share a buffer; halves derived from a per-op stride
overlapped, and a rank one launch ahead overwrote slots its peer was still reading).
Every launch waits for at least one signal that each peer sent in that same launch, so
a rank can be at most one launch ahead of any peer: half `epoch % 2` is free again when
launch `epoch + 2` writes it.
"""
import triton
import triton.language as tl

import trident.language as tdl
from trident.errors import OP_CODES
from trident.trace import device as trd, tags

MAX_PROGRAMS = tl.constexpr(256)      # grid limit of every collective kernel
MAX_RANKS = tl.constexpr(64)
ARRIVE = tl.constexpr(0)              # "I entered this launch": my buffers may be used
DATA = tl.constexpr(1)                # "my data for you is in place"
DONE = tl.constexpr(2)                # "I no longer read or write your buffers"
NUM_PHASES = tl.constexpr(3)
# Op codes that a timed-out wait records (trident/errors.py OP_NAMES), by collective.
OP_ALL_GATHER = tl.constexpr(OP_CODES["all_gather"])
OP_REDUCE_SCATTER = tl.constexpr(OP_CODES["reduce_scatter"])
OP_ALL_REDUCE = tl.constexpr(OP_CODES["all_reduce"])
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
def _flag(flags, phase, src):
    return flags + (phase * MAX_RANKS + src) * MAX_PROGRAMS + tl.program_id(0)


@triton.jit
def notify(flags, phase: tl.constexpr, epoch, rank, peer, heap_bases):
    """Tell `peer` (release, after every store of this program) that this program of
    `rank` reached `phase` of launch `epoch`."""
    tdl.signal(_flag(flags, phase, rank), epoch, rank, peer, heap_bases)


@triton.jit
def wait_for(flags, phase: tl.constexpr, epoch, src, ctrl, rank, op: tl.constexpr):
    """Wait (acquire, bounded) until program of the same id on `src` reached `phase`."""
    tdl.wait(_flag(flags, phase, src), epoch, ctrl, rank, src, op)


@triton.jit
def notify_all(flags, phase: tl.constexpr, epoch, rank, world_size, heap_bases):
    for i in range(1, world_size):
        notify(flags, phase, epoch, rank, (rank + i) % world_size, heap_bases)


@triton.jit
def wait_all(flags, phase: tl.constexpr, epoch, ctrl, rank, world_size, op: tl.constexpr):
    for i in range(1, world_size):
        wait_for(flags, phase, epoch, (rank + i) % world_size, ctrl, rank, op)


@triton.jit
def combine(acc, x, OP: tl.constexpr):
    """acc (fp32) combined with x under SUM / MAX / MIN."""
    x = x.to(tl.float32)
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
        acc = tl.load(local + offs, mask=mask).to(tl.float32)
    else:
        acc = tl.load(slots + offs, mask=mask).to(tl.float32)
    for src in range(1, world_size):
        if src == rank:
            x = tl.load(local + offs, mask=mask)
        else:
            x = tl.load(slots + src * stride + offs, mask=mask)
        acc = combine(acc, x, OP)
    return acc


@triton.jit
def reduce_peers(ptr, offs, mask, offsets, my_offset, rank, world_size, heap_bases,
                 OP: tl.constexpr, WORD: tl.constexpr):
    """Reduce one block of `ptr` over every rank's copy of it (read over NVLink, each at
    its own heap offset: see peer_shift), in rank order 0..world-1."""
    shift = peer_shift(offsets, 0, rank, my_offset, WORD)
    acc = tdl.load(ptr + shift + offs, rank, 0, heap_bases,
                   mask=mask & shift_ok(shift)).to(tl.float32)
    for src in range(1, world_size):
        shift = peer_shift(offsets, src, rank, my_offset, WORD)
        acc = combine(acc, tdl.load(ptr + shift + offs, rank, src, heap_bases,
                                    mask=mask & shift_ok(shift)), OP)
    return acc


@triton.jit
def exchange(flags, phase: tl.constexpr, epoch, ctrl, rank, world_size, heap_bases,
             op: tl.constexpr, trace_buf, TRACE: tl.constexpr):
    """Tell every peer this program reached `phase`, then wait until all of them did
    (traced as one WAIT)."""
    t0 = trd.begin(TRACE)
    notify_all(flags, phase, epoch, rank, world_size, heap_bases)
    wait_all(flags, phase, epoch, ctrl, rank, world_size, op)
    trd.end(trace_buf, t0, tags.WAIT, rank, TRACE)
