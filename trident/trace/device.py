"""Device side of tracing: record (start, end, tag, program, rank) events into a per-rank
buffer on the heap.

    t0 = trd.begin(TRACE)                          # a timestamp, or nothing when off
    ...the phase...
    trd.end(trace_buf, t0, TAG_SEND, rank, TRACE)  # claim a slot atomically, write the event

TRACE is a tl.constexpr: with TRACE=False both calls compile to nothing, so the kernel's
machine code is that of a kernel without tracing. The buffer layout (int64):
  [0] next free slot (atomic counter)   [1] dropped events
  [HEADER + 4*i ...] event i: start_ns, end_ns, tag, (rank << 32) | program id
A full buffer counts the event in [1] instead of writing past its end.
"""
import triton
import triton.language as tl

from ..language import timestamp

HEADER = tl.constexpr(8)        # words before the first event
EVENT_WORDS = tl.constexpr(4)   # words per event


@triton.jit
def begin(TRACE: tl.constexpr):
    if TRACE:
        return timestamp()
    else:
        return 0


@triton.jit
def end(trace_buf, start, tag: tl.constexpr, rank, TRACE: tl.constexpr):
    if TRACE:
        stop = timestamp()
        capacity = tl.load(trace_buf + 2)
        slot = tl.atomic_add(trace_buf, 1, sem="relaxed", scope="gpu")
        if slot < capacity:
            ev = trace_buf + HEADER + slot * EVENT_WORDS
            pid = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)
            tl.store(ev, tl.cast(start, tl.int64))   # an int on the emulation: tl.cast takes it
            tl.store(ev + 1, tl.cast(stop, tl.int64))
            tl.store(ev + 2, tl.cast(tag, tl.int64))     # not tl.full([]): see language/gluon.py
            tl.store(ev + 3, (tl.cast(rank, tl.int64) << 32) | pid.to(tl.int64))
        else:
            tl.atomic_add(trace_buf + 1, 1, sem="relaxed", scope="gpu")
