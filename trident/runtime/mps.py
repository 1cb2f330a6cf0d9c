"""A private MPS control daemon for a job whose ranks share a GPU.

Processes on one GPU without MPS (CUDA's Multi-Process Service) time-slice: one runs while
the others wait, so a kernel that waits for a peer's kernel on the same GPU makes progress
only when the scheduler switches. Measured on one H200: a flag ping-pong between two
processes' Triton kernels took 4.6 ms per round trip without MPS and 1.9 us under MPS.
Under MPS the ranks' kernels run at the same time, as they do on separate GPUs.

`ensure(mode)` is what the launcher calls when ranks will share a GPU:
- an MPS control daemon is already reachable (CUDA_MPS_PIPE_DIRECTORY, default
  /tmp/nvidia-mps): use it;
- else, where `nvidia-cuda-mps-control` exists, start a private one in the foreground as
  a child of the launcher, with its pipe and log directories under a temporary directory
  of the job (so it serves this job's ranks only), and stop it when the job ends: `quit`
  through its pipe, then SIGKILL if it lingers; the kernel also sends it SIGTERM should
  the launcher die first (PR_SET_PDEATHSIG);
- else run without MPS and warn once that every cross-rank wait costs milliseconds.
TRIDENT_MPS=auto (default) | off (never start one; warn) | require (fail rather than run
without MPS).

Ranks that torchrun (or anything but trident.launch) starts are not one process's children,
so no private daemon can serve them: there, ranks that share a GPU need a daemon that runs
already, and trident.init refuses to go on without one (placement.share_plan) unless
TRIDENT_MPS=off says to let them time-slice. The launcher passes TRIDENT_MPS=off to its
ranks when it runs them without MPS (after its warning), and ANSWERED_ENV when it found or
started a daemon, so that its ranks do not each ask the daemon again (a client probe can
fail under load beside a daemon that runs: `daemon_reachable` asks again before it says no).
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
import warnings

from . import options

CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIR = options.variable("CUDA_MPS_PIPE_DIRECTORY").default
MODES = ("auto", "off", "require")
NO_MPS_WARNING = (
    "ranks share a GPU without MPS: their kernels time-slice, so every wait for a peer "
    "costs milliseconds (4.6 ms per round trip measured on an H200, 1.9 us under MPS). "
    "Start `nvidia-cuda-mps-control -d` (or let trident start one: TRIDENT_MPS=auto with "
    "nvidia-cuda-mps-control on PATH).")
_warned = False
_last_probe: dict = {}       # pipe directory -> why the last probe found no daemon there
# Set by the launcher for its ranks: the pipe directory whose daemon it has just found
# answering (or started), so that each rank need not ask again (placement._mps_running).
ANSWERED_ENV = "TRIDENT_MPS_ANSWERED"


def control_binary() -> str | None:
    """Path of nvidia-cuda-mps-control: PATH, then where NVIDIA's container images keep it."""
    found = shutil.which(CONTROL)
    if found:
        return found
    for folder in ("/usr/local/nvidia/bin", "/usr/bin", "/usr/local/bin"):
        path = os.path.join(folder, CONTROL)
        if os.access(path, os.X_OK):
            return path
    return None


def _ask(binary: str, command: str, pipe_dir: str, timeout: float = 10.0) -> tuple[int, str]:
    """Send one command to the control daemon of `pipe_dir`; (exit status, output)."""
    env = options.environ(CUDA_MPS_PIPE_DIRECTORY=pipe_dir)
    try:
        done = subprocess.run([binary], input=command + "\n", capture_output=True, text=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "no answer"
    return done.returncode, (done.stdout + done.stderr).strip()


def daemon_reachable(binary: str | None, pipe_dir: str, tries: int = 4,
                     pause_s: float = 0.5) -> bool:
    """True if a control daemon answers on `pipe_dir` (the client exits non-zero when none
    runs); without the binary, whether its control pipe exists. A client that fails while
    the control pipe is there is asked again, up to `tries` times with `pause_s`, 2 x
    `pause_s`, ... between; what the last one said is kept for the warning (`last_probe`)."""
    if not os.path.exists(os.path.join(pipe_dir, "control")):
        _last_probe[pipe_dir] = "no control pipe there"
        return False
    if binary is None:
        return True
    # a client that gets no answer in time (124) finds a pipe whose daemon is busy, not
    # gone: seen on one H100 with 4 ranks starting while 16 cores compiled (a refusal there
    # stopped the test pool). A client can also fail at once beside a daemon that runs:
    # ranks of a job whose launcher had just found the daemon at the default pipe (so it
    # started no private one) warned that none answered, while many MPS clients of the GPU
    # suite started beside them; the probe asks again before it says no daemon runs.
    for attempt in range(max(1, tries)):
        if attempt:
            time.sleep(pause_s * attempt)
        status, said = _ask(binary, "get_server_list", pipe_dir, timeout=5.0)
        if status in (0, 124):
            _last_probe.pop(pipe_dir, None)
            return True
        if not os.path.exists(os.path.join(pipe_dir, "control")):
            break
    _last_probe[pipe_dir] = (f"{os.path.basename(binary)} exited with status {status} "
                             f"({attempt + 1} tries): {said[:200]!r}")
    return False


def last_probe(pipe_dir: str) -> str | None:
    """Why `daemon_reachable` last said no daemon answers at `pipe_dir` (None: it did not)."""
    return _last_probe.get(pipe_dir)


def _die_with_parent() -> None:
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)    # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class PrivateDaemon:
    """An MPS control daemon of this job only (see the module docstring)."""

    def __init__(self, binary: str, start_timeout: float = 20.0):
        self.binary = binary
        self.root = tempfile.mkdtemp(prefix="trident-mps-")
        self.pipe_dir = os.path.join(self.root, "pipe")
        self.log_dir = os.path.join(self.root, "log")
        os.makedirs(self.pipe_dir)
        os.makedirs(self.log_dir)
        env = options.environ(CUDA_MPS_PIPE_DIRECTORY=self.pipe_dir,
                              CUDA_MPS_LOG_DIRECTORY=self.log_dir)
        self.proc = subprocess.Popen([binary, "-f"], env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)
        atexit.register(self.stop)        # a launcher that never closed its pool
        deadline = time.monotonic() + start_timeout
        while not os.path.exists(os.path.join(self.pipe_dir, "control")):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = (f"exited with status {self.proc.returncode}" if self.proc.poll() is not None
                       else f"made no control pipe within {start_timeout:g} s")
                self.stop()
                raise RuntimeError(f"could not start an MPS control daemon ({binary} -f {why}; "
                                   f"log in {self.log_dir})")
            time.sleep(0.05)

    @property
    def env(self) -> dict:
        """What the rank processes need in their environment to be this daemon's clients."""
        return {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": self.log_dir}

    def stop(self, timeout: float = 10.0) -> None:
        """Quit the daemon (its MPS server goes with it), kill it if it lingers, and remove
        its directories. Call after the client processes have exited."""
        if self.proc is not None and self.proc.poll() is None:
            _ask(self.binary, "quit", self.pipe_dir, timeout=timeout)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)


def ensure(mode: str | None = None) -> tuple[dict, PrivateDaemon | None, str]:
    """Make ranks that share a GPU run under MPS (module docstring). Returns (environment
    for the rank processes, the private daemon to stop at the end or None, a one-line
    description for logs: which MPS the job uses, or that it runs without)."""
    global _warned
    mode = options.get("TRIDENT_MPS", env={"TRIDENT_MPS": mode} if mode else None)
    binary = control_binary()
    pipe_dir = options.get("CUDA_MPS_PIPE_DIRECTORY")
    if daemon_reachable(binary, pipe_dir):
        return {"CUDA_MPS_PIPE_DIRECTORY": pipe_dir}, None, f"MPS: the running daemon at {pipe_dir}"
    if mode != "off" and binary is not None:
        daemon = PrivateDaemon(binary)
        return daemon.env, daemon, f"MPS: a private daemon for this job at {daemon.pipe_dir}"
    if mode == "require":
        raise RuntimeError(f"TRIDENT_MPS=require: ranks share a GPU but no MPS daemon is "
                           f"reachable at {pipe_dir} and {CONTROL} was not found; start one "
                           f"with `{CONTROL} -d` or put it on PATH")
    if not _warned:
        warnings.warn(NO_MPS_WARNING, RuntimeWarning, stacklevel=3)
        _warned = True
    return {}, None, "MPS: none (ranks time-slice the GPU)"
