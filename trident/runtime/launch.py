"""Start N ranks (GPU processes, or CPU processes with gloo) and run code in them.

On GPUs, ranks are placed round-robin over the visible GPUs (trident/runtime/placement.py). With
one GPU per rank the host group is NCCL. With more ranks than GPUs, ranks share GPUs: the
host group is gloo (NCCL refuses two ranks on one device), the ranks run under MPS (a
private daemon for the job when none runs: trident/runtime/mps.py), and their kernels size their
grids by their share of the SMs. That mode checks correctness and host cost on one GPU;
it does not measure NVLink.

`launch(fn, world_size, *args)` runs `fn(ctx, *args)` once on every rank and returns the
list of results. `RankPool` keeps the ranks alive so that many functions can run in the
same processes (the test suite starts each world size once).

If a rank raises, the first error is re-raised here with the rank and its traceback
attached (so is an error that a rank's context raises only at its final close: a last call
that failed unsynchronised); a rank that dies or hangs past `run_timeout` takes the pool
down instead of hanging the caller.
"""
from __future__ import annotations

import glob
import os
import pickle
import socket
import time
import uuid
from multiprocessing.connection import wait as wait_any

import torch.multiprocessing as mp

from . import options
from .rank_errors import exit_status, first_error, pack_error

# How a rank makes its context once its default process group is up, by the group's
# torch.distributed backend: the layers above register theirs (the runtime imports none of
# them): trident.init for NCCL/gloo (key None: trident/api/context.py), the "trident"
# backend's own context (trident/torch/backend). `import trident` registers both, and a
# process that imports this module has imported the package `trident` first.
_RANK_INITS: dict = {}


def register_rank_init(dist_backend: str | None, make, pg_options=None) -> None:
    """make(heap_size, timeout) -> the rank's context, for ranks whose default group has
    backend `dist_backend` (a name found in the dist_backend given to launch, e.g.
    "trident" in "cuda:trident,cpu:gloo"; None: any other), and pg_options(heap_size,
    timeout) -> the group's pg_options, if the backend takes them."""
    _RANK_INITS[dist_backend] = (make, pg_options)


def _rank_init(dist_backend: str | None):
    """(make, pg_options) for a rank whose default group has backend `dist_backend`."""
    named = [k for k in _RANK_INITS if k is not None and dist_backend and k in dist_backend]
    found = _RANK_INITS.get(named[0] if named else None)
    if found is None:
        raise RuntimeError(f"no way to make a rank's context for torch.distributed backend "
                           f"{dist_backend!r} is registered (import trident first)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend() -> str:
    if options.get("TRIDENT_BACKEND"):
        return options.get("TRIDENT_BACKEND")
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_world_size(backend: str) -> int:
    if backend == "cuda":
        import torch
        return torch.cuda.device_count()
    return 4


BACKENDS = ("cuda", "cpu")


def check_world_size(world_size) -> int | None:
    """`world_size` as given to launch/RankPool, checked: None stays None (the default: one
    rank per GPU, or 4 CPU processes); anything else must be an integer of at least 1 -- 0
    is not a synonym for the default."""
    import numbers
    if world_size is None:
        return None
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral):
        raise TypeError(f"world_size must be an int of at least 1, or None for the default "
                        f"(one rank per GPU, or 4 on the CPU); got {type(world_size).__name__} "
                        f"{world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, or None for the default (one rank "
                         f"per GPU, or 4 on the CPU); got {world_size}")
    return int(world_size)


def sharing_env(world_size: int, gpus: int):
    """For ranks that outnumber the GPUs: (the rank processes' environment, the private MPS
    daemon to stop at the end or None, a line saying which MPS the job uses)."""
    from . import mps
    from .placement import CAP_VAR, ranks_on_each_gpu, share_plan
    env, daemon, note = mps.ensure()
    env["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    if not env.get("CUDA_MPS_PIPE_DIRECTORY"):
        env["TRIDENT_MPS"] = "off"   # ensure() warned: the ranks time-slice, as decided here
        return env, daemon, note
    # each rank an equal share of the GPU's threads, so that none can crowd out a peer it
    # waits for (NVSHMEM's condition for PEs on one GPU); a user's setting wins if it is no
    # larger (the ranks check it again: placement.ensure_share)
    try:
        cap, _ = share_plan(max(ranks_on_each_gpu(world_size, gpus)), options.environ(),
                            cuda_initialized=False, mps_running=True)
    except Exception:
        if daemon is not None:
            daemon.stop()
        raise
    env[CAP_VAR] = cap.get(CAP_VAR) or options.get(CAP_VAR)
    env[mps.ANSWERED_ENV] = env["CUDA_MPS_PIPE_DIRECTORY"]   # the ranks need not ask again
    return env, daemon, note


def _detach(obj):
    """Copies of the tensors in a result, on the CPU and compact.

    Results travel by plain pickle: multiprocessing's own pickler would move a CPU
    tensor's storage into a new shared-memory segment -- for a view of the heap, that
    silently unmaps the heap from this rank's tensors while peers keep writing into it.
    """
    import torch
    from torch.utils._pytree import tree_map
    return tree_map(lambda x: x.detach().cpu().clone() if isinstance(x, torch.Tensor) else x, obj)


def _die_with_parent() -> None:
    """Have the kernel kill this process when the launcher dies (Linux), so that ranks
    never outlive a launcher that was SIGKILLed or SIGTERMed. Ctrl-C is the launcher's
    alone: a terminal sends SIGINT to every rank too, and a rank that unwound its own
    KeyboardInterrupt (tracebacks, pickled replies) would only take CPU from the launcher
    while it stops them (see RankPool.run); an idle rank would die of it."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass                       # not Linux: the pipe's EOF still ends an idle rank
    if os.getppid() == 1:          # the launcher died before prctl took effect
        os._exit(1)


_gc_skipped_at_exit = False
# The launcher's waits wake this often. A SIGINT that the kernel hands to another thread
# of the launcher (torch starts one at import) only sets Python's flag: the main thread,
# blocked in poll(), would not raise KeyboardInterrupt before its wait ended (measured:
# still waiting after 30 s); awake, it raises it at once.
_WAKE_S = 0.25
_CLOSE = "close"       # the request number of a rank's reply to the launcher's stop


def _exit_without_gc() -> None:
    """At interpreter exit (not now: a program that catches KeyboardInterrupt goes on as
    before), collect garbage once, then freeze every object, so that the collections of
    Python's finalisation skip them. With torch imported they cost about 0.5 s of CPU
    (measured on the CPU emulation's 2-core machine), most of the time from Ctrl-C to the
    shell's prompt on a busy machine. What the exit then leaves uncollected: reference
    cycles that only form while modules are torn down (their __del__ does not run; Python
    does not promise it at exit anyway)."""
    global _gc_skipped_at_exit
    if _gc_skipped_at_exit:
        return
    import atexit
    import gc

    def collect_then_freeze():
        gc.collect()
        gc.freeze()
    atexit.register(collect_then_freeze)
    _gc_skipped_at_exit = True


def _worker(rank, world_size, backend, port, heap_size, timeout, conn, dist_backend=None):
    _die_with_parent()
    import datetime

    import torch
    import torch.distributed as dist

    from .placement import device_index
    # host collectives (barriers, debug checks) give up after the context's timeout too
    pg_timeout = datetime.timedelta(seconds=timeout or 30.0)
    if dist_backend is not None:     # e.g. "trident": the context is the backend's own
        _serve(conn, *_init_with_backend(dist_backend, rank, world_size, backend, port,
                                         heap_size, timeout, pg_timeout, conn))
        return
    if backend == "cuda":
        gpus = torch.cuda.device_count()
        device = torch.device("cuda", device_index(rank, gpus))
        torch.cuda.set_device(device)
        if world_size <= gpus:
            dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                    world_size=world_size, device_id=device, timeout=pg_timeout)
        else:      # ranks share GPUs: NCCL refuses two ranks on one device
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                    world_size=world_size, timeout=pg_timeout)
    else:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=pg_timeout)
    try:
        ctx = _rank_init(None)[0](heap_size, timeout)
    except BaseException as exc:
        conn.send((0, "err", *pack_error(exc)))
        raise
    conn.send((0, "ok", None))
    _serve(conn, ctx, dist)


def _init_with_backend(dist_backend, rank, world_size, backend, port, heap_size, timeout,
                       pg_timeout, conn):
    """The default group made with torch.distributed backend `dist_backend` (for one that
    holds a trident context, as "trident" does, that context: it is the rank's ctx)."""
    import torch
    import torch.distributed as dist

    from .placement import device_index
    if backend == "cuda":
        torch.cuda.set_device(device_index(rank, torch.cuda.device_count()))
    else:
        torch.set_num_threads(1)
    try:
        make, pg_options = _rank_init(dist_backend)
        dist.init_process_group(dist_backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=pg_timeout,
                                pg_options=pg_options and pg_options(heap_size, timeout))
        ctx = make(heap_size, timeout)
    except BaseException as exc:
        conn.send((0, "err", *pack_error(exc)))
        raise
    conn.send((0, "ok", None))
    return ctx, dist


def _serve(conn, ctx, dist) -> None:
    """Run the launcher's requests on this rank until it says stop (or is gone)."""
    while True:
        try:
            msg = conn.recv()
        except EOFError:           # the launcher is gone
            break
        if msg is None:
            break
        seq = msg[0]               # every reply names its request (see RankPool._collect)
        if msg[1] == "reset":
            try:
                ctx.reset()
                conn.send((seq, "ok", None))
            except BaseException as exc:   # e.g. a process group broken by a timeout
                conn.send((seq, "err", *pack_error(exc)))
            continue
        _, fn, args = msg
        before = set(ctx.allocator.live_offsets())
        try:
            reply = (seq, "ok", fn(ctx, *args))
        except BaseException as exc:   # report everything, keep serving
            # peers that wait for this rank in a call it will not make stop at once
            ctx.leave(f"{getattr(fn, '__name__', 'fn')}() (run on every rank by "
                      f"trident.launch)", exc)
            reply = (seq, "err", *pack_error(exc))
        finally:
            ctx.free_since(before)
        try:
            conn.send_bytes(pickle.dumps(_detach(reply)))
        except Exception as exc:       # unpicklable result
            conn.send((seq, "err", *pack_error(exc)))
    # close() raises a trident error still pending (a last call that failed, unsynced):
    # the launcher's close raises it (RankPool.close), rather than the rank's stderr alone
    try:
        ctx.close()
        reply = (_CLOSE, "ok", None)
    except BaseException as exc:       # noqa: BLE001 -- reported, then the process ends
        reply = (_CLOSE, "err", *pack_error(exc))
    try:
        conn.send(reply)
    except OSError:                    # the launcher is gone
        pass
    dist.destroy_process_group()


class RankPool:
    """`world_size` rank processes, each holding a trident Context, serving `run` calls.

    dist_backend: the torch.distributed backend of the ranks' default group; None: NCCL
    (one GPU per rank) or gloo, as `launch` says. "trident" (or a device map such as
    "cuda:trident,cpu:gloo") makes the default group trident's torch.distributed backend
    (trident/torch/backend), and the ctx that functions get is that group's context."""

    def __init__(self, world_size: int | None = None, backend: str | None = None,
                 heap_size: int | None = None, timeout: float | None = None,
                 run_timeout: float = 600.0, dist_backend: str | None = None):
        world_size = check_world_size(world_size)
        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
        self.backend = backend or default_backend()
        gpus = 0
        if self.backend == "cuda":
            import torch
            gpus = torch.cuda.device_count()
            if gpus < 1:
                raise ValueError("backend 'cuda' needs a visible GPU; none is (backend='cpu' "
                                 "runs the CPU emulation)")
        self.world_size = world_size or default_world_size(self.backend)
        self.mps_note, self._mps = None, None
        self._procs, self._conns = [], []
        env = {}
        if self.backend == "cuda" and self.world_size > gpus:   # ranks share GPUs (docstring)
            env, self._mps, self.mps_note = sharing_env(self.world_size, gpus)
        self.run_timeout = run_timeout
        # how long the other ranks may take to report after one failed or died: they may be
        # in a host collective that ends only at the context's host timeout (its timeout
        # + 5 s, Context.host_timeout_s); 2 s more lets them report that timeout themselves
        self.failure_grace = (timeout or 30.0) + 5.0 + 2.0
        self._seq = 0            # the number of the last request sent to the ranks
        self.job = uuid.uuid4().hex[:12]
        env.update(TRIDENT_BACKEND=self.backend, TRIDENT_JOB_ID=self.job)
        if self.backend == "cpu":
            env["TRITON_INTERPRET"] = "1"
        spawn = mp.get_context("spawn")
        port = _free_port()
        with options.exported(env):          # the ranks' environment; this process's after
            for rank in range(self.world_size):
                parent, child = spawn.Pipe()
                proc = spawn.Process(target=_worker, daemon=True, name=f"trident-rank{rank}",
                                     args=(rank, self.world_size, self.backend, port, heap_size,
                                           timeout, child, dist_backend))
                proc.start()
                child.close()
                self._procs.append(proc)
                self._conns.append(parent)
        self._collect(timeout=300.0, what="start-up")

    @property
    def closed(self) -> bool:
        """True once the pool is closed (by close(), or after its ranks died or hung)."""
        return self._procs is None

    @property
    def pids(self) -> list[int]:
        """Process ids of the ranks, in rank order (empty once closed)."""
        return [] if self._procs is None else [p.pid for p in self._procs]

    def run(self, fn, *args, timeout: float | None = None) -> list:
        """Run fn(ctx, *args) on every rank; return the results in rank order."""
        if self._procs is None:
            raise RuntimeError("this RankPool is closed")
        self._seq += 1
        seq = self._seq
        try:
            msg = pickle.dumps((seq, fn, args))
        except Exception as exc:
            raise TypeError(f"fn and its arguments are sent to the rank processes and must be "
                            f"picklable (a module-level function): {exc}") from None
        what = getattr(fn, "__name__", "fn")
        try:
            for conn in self._conns:
                conn.send_bytes(msg)
            try:
                return self._collect(timeout or self.run_timeout, what=what, seq=seq)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                if self._procs is not None:
                    try:
                        self._reset()
                    except Exception as reset_exc:
                        self.close(force=True)
                        exc.add_note(f"afterwards the ranks could not be reset ({reset_exc}); "
                                     f"the rank processes were stopped")
                raise
        except KeyboardInterrupt:      # also while sending, or in the reset after an error
            self._interrupted()
            raise KeyboardInterrupt(f"interrupted while the ranks ran {what}; the rank "
                                    f"processes were stopped") from None

    def _interrupted(self) -> None:
        """Ctrl-C: stop the ranks now, no polite reset (the user wants out), and have the
        interpreter's exit, which most likely follows, skip its garbage collections."""
        self.close(force=True)
        _exit_without_gc()

    def _reset(self) -> None:
        self._seq += 1
        for conn in self._conns:
            conn.send((self._seq, "reset"))
        self._collect(timeout=self.failure_grace + 60.0, what="reset", seq=self._seq)

    def _collect(self, timeout: float, what: str, seq: int = 0) -> list:
        """The replies to request `seq` (0: start-up), in rank order. A reply to an earlier
        request is dropped: a run the caller gave up on (a test's timeout, an exception in
        the caller's thread) still answers when its ranks finish, after the reset or the next
        run was sent, and must not be taken for their answer."""
        deadline = time.monotonic() + timeout
        results: dict[int, object] = {}
        errors: list[tuple[float, int, tuple]] = []
        died: dict[int, object] = {}
        stuck_note = None
        pending = {conn: rank for rank, conn in enumerate(self._conns)}
        sentinels = {p.sentinel: rank for rank, p in enumerate(self._procs)}
        while pending:
            left = deadline - time.monotonic()
            ready = wait_any(list(pending) + [s for s, r in sentinels.items() if r not in died],
                             timeout=max(0.0, min(left, _WAKE_S)))
            if not ready and left > _WAKE_S:
                continue
            if not ready:
                stuck = sorted(pending.values())
                self.close(force=True)
                if errors or died:
                    stuck_note = f"ranks {stuck} were still waiting after rank(s) failed; " \
                                 f"the rank processes were stopped"
                    break
                raise TimeoutError(f"{what}: rank(s) {stuck} did not finish within {timeout:g} s; "
                                   f"the rank processes were stopped")
            for conn in [c for c in ready if c in pending]:
                rank = pending.pop(conn)
                try:
                    reply = conn.recv()
                except EOFError:
                    self._procs[rank].join(timeout=5)      # reap it: the exit code is known
                    died[rank] = self._procs[rank].exitcode
                    # the others get a moment to say what they were doing (they may be
                    # waiting for the dead rank in an op, until the context's timeout)
                    deadline = min(deadline, time.monotonic() + self.failure_grace)
                    continue
                if reply[0] != seq:            # a late answer to a request given up on
                    pending[conn] = rank
                    continue
                if reply[1] == "ok":
                    results[rank] = reply[2]
                else:
                    errors.append((time.monotonic(), rank, reply[2:]))
                    # peers of a failed rank may wait for it in a collective forever
                    deadline = min(deadline, time.monotonic() + self.failure_grace)
            for sentinel in [s for s in ready if s in sentinels]:
                rank = sentinels[sentinel]
                conn = self._conns[rank]
                if conn in pending and not conn.poll():
                    pending.pop(conn)
                    self._procs[rank].join(timeout=5)
                    died[rank] = self._procs[rank].exitcode
                    deadline = min(deadline, time.monotonic() + self.failure_grace)
        if died:
            self.close(force=True)
            first = min(died)
            exc = RuntimeError(
                f"{what}: rank {first} process died ({exit_status(died[first])})"
                + (f"; so did ranks {sorted(died)[1:]}" if len(died) > 1 else "")
                + "; the rank processes were stopped")
            for _, rank, (_, summary, _, _) in sorted(errors, key=lambda e: e[1]):
                exc.add_note(f"rank {rank} then raised {summary}")
            if stuck_note:
                exc.add_note(stuck_note)
            raise exc
        if errors:
            exc = first_error(errors, what, self.world_size)
            if stuck_note:
                exc.add_note(stuck_note)
            timed_out = sorted(r for _, r, (_, _, _, level) in errors if level == 2)
            if timed_out and self._procs is not None:
                # a host collective that timed out leaves its process group unusable: a
                # reset would only wait for the transport's timeout once more
                self.close(force=True)
                exc.add_note(f"a host-side collective timed out on rank(s) {timed_out}, after "
                             f"which the process groups cannot be used again; the rank "
                             f"processes were stopped")
            raise exc
        return [results[r] for r in range(self.world_size)]

    def close(self, force: bool = False) -> None:
        """Stop the ranks: each closes its context (collective) and exits. Raises the
        error that a rank's close raised (a trident error still pending there: a last
        call that failed and that nothing synchronised since), after every rank is gone.
        force: kill the processes at once."""
        if self._procs is None:
            return
        procs, self._procs = self._procs, None
        errors = []
        if not force:
            for conn in self._conns:
                try:
                    conn.send(None)
                except OSError:
                    pass
            errors = _close_replies(self._conns, time.monotonic() + 60)
            for p in procs:
                p.join(timeout=60)
        for p in procs:                # all at once: they exit in parallel
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join()
        if self._mps is not None:     # after its clients (the ranks) are gone
            self._mps.stop()
            self._mps = None
        for path in glob.glob(f"/dev/shm/trident-{self.job}-*"):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        if errors:
            raise first_error(errors, "the close of its context, after the last run",
                              self.world_size)

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        try:
            self.close(force=exc_type is not None and issubclass(exc_type, KeyboardInterrupt))
        except Exception:
            if exc_type is None:       # else the error that ended the block is the news
                raise


def _close_replies(conns, deadline: float) -> list:
    """The errors (time, rank, pack_error's tuple) that the ranks' closes reported, read
    until `deadline`; a late reply to an earlier request is skipped, a rank that is gone
    or silent reports nothing (its exit is the news)."""
    errors = []
    for rank, conn in enumerate(conns):
        try:
            while conn.poll(max(0.0, deadline - time.monotonic())):
                reply = conn.recv()
                if reply[0] == _CLOSE:
                    if reply[1] == "err":
                        errors.append((time.monotonic(), rank, reply[2:]))
                    break
        except (EOFError, OSError):
            pass
    return errors


def launch(fn, world_size: int | None = None, *args, backend: str | None = None,
           heap_size: int | None = None, timeout: float | None = None,
           run_timeout: float = 600.0, dist_backend: str | None = None) -> list:
    """Spawn `world_size` ranks, run fn(ctx, *args) on each, return the per-rank results.

    world_size: an int of at least 1, or None for the default (one rank per visible GPU, or
    4 CPU processes); 0, negatives and non-integers raise ValueError / TypeError.

    backend: "cuda" (GPU processes: one per GPU with NCCL, or several per GPU round-robin,
    under MPS, with gloo when world_size exceeds the GPUs) or "cpu" (gloo, Triton
    interpreter); default: cuda when GPUs are visible. fn must be a module-level function.
    timeout: seconds every device wait and host collective may take (the context's
    timeout); run_timeout: seconds the whole of fn may take before the ranks are stopped.
    dist_backend="trident": the ranks' default process group is trident's torch.distributed
    backend, so that torch.distributed calls in fn (DTensor, FSDP2, ...) run on trident, and
    ctx is that group's context (see RankPool).
    """
    with RankPool(world_size, backend=backend, heap_size=heap_size, timeout=timeout,
                  run_timeout=run_timeout, dist_backend=dist_backend) as pool:
        return pool.run(fn, *args)
