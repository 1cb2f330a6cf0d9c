"""The launcher under faults: rank processes never outlive it, and Ctrl-C returns fast."""
import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from .procs import alive

SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading, time
    import trident as td

    # Ctrl-C raises KeyboardInterrupt even where the test's parent ignores SIGINT (a
    # shell's background job does, and passes it on: the script would not stop at all)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def nap(ctx):
        os.write(1, f"ranks {os.getpid()}\\n".encode())   # one write: ranks never interleave
        time.sleep(300)

    if __name__ == "__main__":
        # a thread of the launcher's own, beside whatever threads torch starts: the kernel
        # may hand a process's SIGINT to any of its threads
        threading.Thread(target=time.sleep, args=(600,), daemon=True, name="idle").start()
        td.launch(nap, 2, backend="cpu", heap_size=1 << 20)
""")


def _start(tmp_path):
    """Run the script; return it and its two rank pids once both ranks are up. Reads the
    pipe with a deadline (a bare readline could block the suite forever)."""
    path = tmp_path / "nap.py"
    path.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, start_new_session=True)
    seen = b""
    deadline = time.monotonic() + 180
    while len(re.findall(rb"ranks (\d+)", seen)) < 2 and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            seen += chunk
    ranks = {int(p) for p in re.findall(rb"ranks (\d+)", seen)}
    if len(ranks) < 2:
        proc.kill()
        err = proc.stderr.read().decode(errors="replace")[-1500:]
        pytest.fail(f"ranks did not start within 180 s; stdout so far: {seen[-500:]!r}; "
                    f"stderr: {err}")
    return proc, ranks


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_ranks_die_with_the_launcher(tmp_path, sig):
    proc, ranks = _start(tmp_path)
    proc.send_signal(sig)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in ranks), "rank processes outlived their launcher"


def _to_group(proc):
    os.killpg(proc.pid, signal.SIGINT)       # as a terminal's Ctrl-C: launcher and ranks


def _to_other_thread(proc):
    """SIGINT to a thread of the launcher other than the main one (kill() with a thread id
    hands a process-wide signal to that thread: as the kernel may choose to)."""
    threads = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid)
    assert threads, "the script starts a thread of its own"
    os.kill(threads[0], signal.SIGINT)


@pytest.mark.parametrize("send", [_to_group, _to_other_thread], ids=["group", "other_thread"])
def test_ctrl_c_returns_quickly_with_a_message(tmp_path, send):
    """Within 5 s of Ctrl-C the launcher has exited, with its message, even on a busy
    machine, and whichever of its threads the signal reached."""
    proc, ranks = _start(tmp_path)
    t0 = time.monotonic()
    send(proc)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    took = time.monotonic() - t0
    err = err.decode(errors="replace")
    assert took < 5, f"Ctrl-C took {took:.1f} s (more than 5 s); stderr: {err[-1500:]}"
    assert "interrupted while the ranks ran nap" in err
    time.sleep(1)
    assert not any(alive(p) for p in ranks)


def _pid(ctx):
    return os.getpid()


def test_idle_ranks_leave_ctrl_c_to_the_launcher():
    """SIGINT reaches the ranks too (one process group): an idle rank must not die of it
    (the launcher decides; the pool stays usable when the program catches the interrupt)."""
    from tests.conftest import get_pool
    pool = get_pool(2)
    for pid in pool.pids:
        os.kill(pid, signal.SIGINT)
    time.sleep(2)
    assert pool.run(_pid) == pool.pids
