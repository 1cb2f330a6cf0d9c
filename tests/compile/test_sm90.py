"""Every kernel of the package compiles for sm_90 (Hopper) with the real compiler at the
constexpr combinations its host code launches, and the copy loops keep 16-byte accesses --
checked where there is no GPU (tests/compile/sm90.py lists the kernels)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_kernel_compiles_for_sm90(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRIDENT_BACKEND")}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "tests.compile.sm90"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.strip().endswith(": ok"), \
        proc.stdout[-3000:] + proc.stderr[-4000:]
