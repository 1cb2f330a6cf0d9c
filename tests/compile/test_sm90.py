"""Every kernel of the package compiles for sm_90 (Hopper) with the real compiler at the
constexpr combinations its host code launches, and the copy loops keep 16-byte accesses --
checked where there is no GPU (tests/compile/sm90.py lists the kernels)."""
from . import run_check


def test_every_kernel_compiles_for_sm90(tmp_path):
    run_check("tests.compile.sm90", tmp_path / "cache", ": ok", timeout=900)
