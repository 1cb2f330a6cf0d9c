"""Intra-kernel tracing: device events -> one Chrome/Perfetto JSON merged across ranks.

Record (in a kernel): take two extra arguments, `trace_buf` and `TRACE: tl.constexpr`,
filled on the host from `kernel_args(ctx)` at every call, and wrap phases:

    t = trd.begin(TRACE)                               # trident.trace.device as trd
    ...the phase...
    trd.end(trace_buf, t, tags.SEND, rank, TRACE)      # trident.trace.tags

With TRACE=False the kernel's machine code is that of a kernel without these calls
(tests/trace/test_compile_switch.py compares the PTX and the SASS).

Capture (on the host, every rank):

    with ctx.trace("ag.json", capacity=1 << 16) as t:  # events per rank
        ctx.all_gather(out, inp)
    t.summary, t.dropped                               # also printed by rank 0

or from the shell: `trident trace all_gather` (trident/tools/trace.py).

Read it: open the file in https://ui.perfetto.dev (or chrome://tracing).
- One process per rank ("rank 0", "rank 1", ...), one thread per program id of the
  kernels ("program 17"). Programs of successive kernels share a thread; a slice that
  overlaps another partly (two kernels at once) goes to "program 17 (overlap 1)".
- Slices are named by tag: send, wait, copy, reduce, gemm_tile, fetch, dispatch,
  combine, recv, barrier, kernel. Nested slices are phases inside a program's "kernel".
- Time 0 is the earliest event of any rank. On GPUs timestamps are %globaltimer
  nanoseconds, one clock for all GPUs of the node, so a "wait" on one rank lines up with
  the "send" on the peer it waits for; its resolution is a few tens of ns up to 1 us
  depending on the GPU and driver. `end` reads the clock when its thread reaches it:
  a phase's stores may still be in flight (only a wait's end is exact).
- On the CPU emulation timestamps are CLOCK_MONOTONIC nanoseconds of the host
  (time.monotonic_ns), which every rank process shares: ranks line up as on GPUs, but
  durations are those of the Triton interpreter (Python), and programs of one rank run
  one after another, never at once. We chose this over a logical (Lamport) clock
  because it keeps durations and cross-rank order, which is what the timeline is for.
- Wide "wait" slices are time spent for a peer; compare with the peer's "send".
  Select slices and use Perfetto's aggregate view, or read the summary table (count,
  min/median/max/total microseconds per tag per rank) printed when the session ends.
- otherData.dropped_events: events that did not fit (raise capacity=); a trace with
  drops lacks its latest events, not random ones.
"""


def kernel_args(ctx):
    """(buffer, enabled) to pass as a kernel's trace_buf and TRACE arguments."""
    buf = ctx.trace_buffer
    if buf is None:
        return ctx.ctrl, False          # any int64 tensor: never touched when TRACE is off
    return buf, True


from .session import TraceSession  # noqa: E402


# Defined after the import on purpose: importing the submodule `session` sets the
# package attribute of that name, and this function must be what stays there.
def session(ctx, path=None, **options) -> TraceSession:
    """What ctx.trace(path, **options) returns: see TraceSession."""
    return TraceSession(ctx, path, **options)
