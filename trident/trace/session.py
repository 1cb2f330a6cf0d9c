"""`with ctx.trace(path):` -- record the device events of every op inside, then write
one Chrome/Perfetto trace merged across ranks and print a summary.

Collective: every rank enters and leaves the session at the same point of its program
(the event buffer is a heap allocation, and leaving gathers the events of all ranks).
Ops read `trident.trace.kernel_args(ctx)` at each call, so a kernel launched inside the
session is the TRACE=True specialization of that kernel (compiled on its first traced
call: warm the op up traced, or expect the first call's events to include nothing of
the compile but its launch to come late) and one launched outside it is untouched.

After the block the session object holds what was recorded on every rank:
  .events[r]   int64 [n, 4] array of rank r (start_ns, end_ns, tag, rank<<32 | program)
  .dropped[r]  events rank r could not record because its buffer was full
  .summary     rows of the per-tag, per-rank table (trident.trace.summary)
  .trace       the Chrome trace dict (rank 0 only; None elsewhere)
"""
from __future__ import annotations

import json
import os

import numpy as np
import torch
import torch.distributed as dist

from .chrome import to_chrome
from .device import EVENT_WORDS, HEADER
from .summary import format_table, summarize

DEFAULT_CAPACITY = 1 << 16          # events per rank: 2 MiB of heap
_HEADER, _WORDS = int(HEADER.value), int(EVENT_WORDS.value)


class TraceSession:
    """Context manager returned by ctx.trace(path, capacity=..., print_summary=...)."""

    def __init__(self, ctx, path=None, capacity: int = DEFAULT_CAPACITY,
                 print_summary: bool = True):
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"trace path must be a str or os.PathLike (or None to keep the "
                            f"events in memory only), got {type(path).__name__}")
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise TypeError(f"capacity must be an int (events per rank), got "
                            f"{type(capacity).__name__}")
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1 event per rank, got {capacity}")
        self.ctx, self.path, self.capacity = ctx, path, capacity
        self.print_summary = print_summary
        self.buffer = None
        self.events: list[np.ndarray] = []
        self.dropped: list[int] = []
        self.summary: list[dict] = []
        self.trace: dict | None = None

    def __enter__(self) -> "TraceSession":
        ctx = self.ctx
        if ctx.trace_buffer is not None:
            raise RuntimeError("a trace session is already active on this context; "
                               "trace sessions do not nest")
        self.buffer = ctx.zeros(_HEADER + _WORDS * self.capacity, dtype=torch.int64)
        self.buffer[2] = self.capacity
        ctx.barrier()                # every rank's buffer is ready before any traced op
        ctx.trace_buffer = self.buffer
        ctx.plans.clear()            # plans launch with the trace switch they were built with
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        ctx = self.ctx
        ctx.trace_buffer = None
        ctx.plans.clear()
        if exc_type is not None:
            # Another rank may not fail here: do nothing collective, just let go of the
            # buffer once no kernel can still write into it.
            if ctx.backend == "cuda":
                torch.cuda.synchronize(ctx.device)
            ctx.free(self.buffer)
            self.buffer = None
            return False
        try:
            ctx.barrier()            # all kernels done on all ranks; timeouts raise everywhere
            header = self.buffer[:_HEADER].cpu()
            claimed, dropped = int(header[0]), int(header[1])
            used = min(claimed, self.capacity)
            mine = self.buffer[_HEADER:_HEADER + _WORDS * used].view(used, _WORDS).cpu().numpy()
            mine = mine.copy()
        finally:
            ctx.free(self.buffer)
            self.buffer = None
        gathered = [None] * ctx.world_size
        dist.all_gather_object(gathered, (mine, dropped), group=ctx.group)
        self.events = [g[0] for g in gathered]
        self.dropped = [g[1] for g in gathered]
        self.summary = summarize(self.events)
        if ctx.rank == 0:
            self.trace = to_chrome(self.events, self.dropped,
                                   {"backend": ctx.backend, "world_size": ctx.world_size})
            if self.path is not None:
                self._write(self.path)
            if self.print_summary:
                print(self.report(), flush=True)
        return False

    def _write(self, path) -> None:
        folder = os.path.dirname(os.fspath(path))
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(path, "w") as f:
            json.dump(self.trace, f, separators=(",", ":"))

    def report(self) -> str:
        """The summary table, the dropped count and where the trace went."""
        total = sum(len(ev) for ev in self.events)
        where = f"written to {self.path} (open it in ui.perfetto.dev)" if self.path else \
            "not written (no path given)"
        return (f"trace: {total} events from {len(self.events)} ranks, "
                f"{sum(self.dropped)} dropped; {where}\n"
                + format_table(self.summary, self.dropped))
