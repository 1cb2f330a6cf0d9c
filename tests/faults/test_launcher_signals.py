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
    import os, sys, time
    import trident as td

    def nap(ctx):
        os.write(1, f"ranks {os.getpid()}\\n".encode())   # one write: ranks never interleave
        time.sleep(300)

    if __name__ == "__main__":
        td.launch(nap, 2, backend="cpu", heap_size=1 << 20)
""")


def _start(tmp_path):
    """Run the script; return it and its two rank pids once both ranks are up. Reads the
    pipe with a deadline (a bare readline could block the suite forever)."""
    path = tmp_path / "nap.py"
    path.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
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


def test_ctrl_c_returns_quickly_with_a_message(tmp_path):
    proc, ranks = _start(tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    err = err.decode(errors="replace")
    assert time.monotonic() - t0 < 5, "Ctrl-C took longer than 5 s"
    assert "interrupted while the ranks ran nap" in err
    time.sleep(1)
    assert not any(alive(p) for p in ranks)
