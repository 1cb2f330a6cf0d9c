"""Every kernel of the package compiles for sm_90 (Hopper) with the real compiler at the
constexpr combinations its host code launches, and the copy loops keep 16-byte accesses --
checked where there is no GPU (tests/compile/sm90.py lists the kernels).

It uses no rank pool, so it runs once (`once`: with the world sizes that include the
smallest default one), and it compiles every kernel cold in a private cache: about 135 s
on a GPU machine's CPU while other tests ran beside it, so it carries its own timeout,
above the suite's per-test one (bench/gpu_suite.sh: --timeout 150)."""
import pytest

from ..conftest import once
from . import run_check

COMPILE_TIMEOUT_S = 900


@once
@pytest.mark.timeout(COMPILE_TIMEOUT_S + 60)
def test_every_kernel_compiles_for_sm90(tmp_path):
    run_check("tests.compile.sm90", tmp_path / "cache", ": ok", timeout=COMPILE_TIMEOUT_S)


@once
@pytest.mark.timeout(360)
def test_a_wait_decides_once_per_program(tmp_path):
    """No program barrier inside the per-warp part of a wait; error records need none
    (tests/compile/uniform_wait.py: one small kernel, a few seconds)."""
    run_check("tests.compile.uniform_wait", tmp_path / "cache", "uniform_wait: ok", timeout=300)
