"""Compile checks for sm_90 that need no GPU: each runs a module of this suite in a fresh
interpreter (no TRITON_INTERPRET, a private Triton cache) and expects its last line to end
with "<name>: ok" (`run_check`)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(*args: str, timeout: float, cache_dir=None):
    """`python *args` from the repository root with the real compiler (no interpreter,
    the GPU backend; `cache_dir`: a private Triton cache): the finished process, its
    output captured."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRIDENT_BACKEND")}
    if cache_dir is not None:
        env["TRITON_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def run_check(module: str, cache_dir, done: str, timeout: float) -> None:
    """Run `python -m module` (`run_python`, in a private cache) and assert that it exits
    0 and that its output ends with `done`."""
    proc = run_python("-m", module, timeout=timeout, cache_dir=cache_dir)
    assert proc.returncode == 0 and proc.stdout.strip().endswith(done), \
        proc.stdout[-3000:] + proc.stderr[-4000:]
