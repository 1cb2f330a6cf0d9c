"""A worker process that runs a benchmark's tasks one at a time, each under a time limit.

A kernel that never finishes (a deadlocked mbarrier, a spin on a flag nobody sets) holds
the process that launched it in its next synchronisation for ever; no Python code of that
process runs again. So the measurements run in a child process -- it owns the CUDA context
-- and the parent, which never touches the GPU, waits for each answer at most `timeout_s`
seconds. A task that takes longer is reported as timed out, the child is killed (the driver
tears its context down, hung kernel included) and the next task starts a fresh one.

    worker = BoundedWorker(handler)           # handler: a module-level function task -> result
    outcome = worker.run(task, timeout_s=60, deadline=time.monotonic() + 300)
    outcome.status                            # "ok", "error", "timeout", "budget" or "died"
    worker.close()

`handler` runs in the child (spawned, so it must be importable by name); it may keep state
between tasks in its module (e.g. the inputs of the current shape), which a replaced child
rebuilds. `deadline` (time.monotonic()) bounds the whole run: a task cut short by it,
rather than by its own limit, has status "budget". Starting a child (importing torch,
making the CUDA context) has its own limit, `start_timeout_s`, also cut by the deadline.
"""
from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from typing import Any, Callable, NamedTuple


class Outcome(NamedTuple):
    status: str              # ok | error | timeout | budget | died
    value: Any               # the handler's result (ok), or a message saying what happened
    seconds: float           # wall time the parent waited


def _serve(conn, handler: Callable[[Any], Any]) -> None:
    """The child: answer each task with ("ok", result) or ("error", message) until None."""
    conn.send(("ready", None))
    while True:
        task = conn.recv()
        if task is None:
            return
        try:
            reply = ("ok", handler(task))
        except Exception as exc:       # the task failed; the worker lives on
            tail = traceback.format_exc(limit=-3)[-600:]
            reply = ("error", f"{type(exc).__name__}: {str(exc)[:300]}\n{tail}")
        conn.send(reply)


class BoundedWorker:
    """One child process at a time (started on first use, replaced after a timeout or a
    crash); see the module docstring."""

    def __init__(self, handler: Callable[[Any], Any], start_timeout_s: float = 180.0):
        self.handler = handler
        self.start_timeout_s = start_timeout_s
        self.replaced = 0            # children killed or lost so far
        self._mp = mp.get_context("spawn")
        self._proc = None
        self._conn = None

    def run(self, task: Any, timeout_s: float, deadline: float | None = None) -> Outcome:
        """Send `task` to the child and wait for its answer, at most timeout_s seconds (and
        never past `deadline`); the time a fresh child takes to start is not counted."""
        t0 = time.monotonic()
        if self._proc is None:
            started = self._start(deadline)
            if started is not None:
                return started
        t1 = time.monotonic()
        limit, status = timeout_s, "timeout"
        if deadline is not None and deadline - t1 < timeout_s:
            limit, status = max(deadline - t1, 0.0), "budget"
        try:
            self._conn.send(task)
            if not self._conn.poll(limit):
                self._kill()
                return Outcome(status, f"no answer after {limit:.0f} s", time.monotonic() - t0)
            kind, value = self._conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            return self._lost(t0)
        return Outcome(kind, value, time.monotonic() - t0)

    def close(self) -> None:
        """Ask the child to exit (kill it if it does not within 10 s)."""
        if self._proc is None:
            return
        try:
            self._conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        self._proc.join(10)
        self._kill(replaced=False)

    # ------------------------------------------------------------------ internals
    def _start(self, deadline: float | None) -> Outcome | None:
        t0 = time.monotonic()
        parent, child = self._mp.Pipe()
        self._proc = self._mp.Process(target=_serve, args=(child, self.handler), daemon=True,
                                      name="trident-bench-worker")
        self._proc.start()
        child.close()
        self._conn = parent
        limit, status = self.start_timeout_s, "timeout"
        if deadline is not None and deadline - t0 < limit:
            limit, status = max(deadline - t0, 0.0), "budget"
        try:
            if parent.poll(limit):
                parent.recv()
                return None
        except (EOFError, OSError):
            return self._lost(t0)
        self._kill()
        return Outcome(status, f"the worker did not start within {limit:.0f} s",
                       time.monotonic() - t0)

    def restart(self) -> None:
        """Kill the child now (e.g. its CUDA context is broken); the next task starts a new one."""
        self._kill()

    def _lost(self, t0: float) -> Outcome:
        code = None
        if self._proc is not None:
            self._proc.join(5)
            code = self._proc.exitcode
        self._kill()
        return Outcome("died", f"the worker exited (code {code})", time.monotonic() - t0)

    def _kill(self, replaced: bool = True) -> None:
        """End this worker's child (by its own handle) and forget it; replaced: count it
        (a child lost to a timeout or a crash, rather than closed)."""
        proc, self._proc = self._proc, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if proc is None:
            return
        self.replaced += replaced
        if proc.is_alive():
            proc.kill()
        proc.join(30)
