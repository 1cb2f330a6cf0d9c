"""Every kernel of the package compiles for sm_90 (Hopper) with the real compiler at the
constexpr combinations its host code launches, and the copy loops keep 16-byte accesses --
checked where there is no GPU (tests/compile/sm90.py lists the kernels; the last test
here checks, compiling nothing, that the list has every kernel of the registry's
algorithms).

It uses no rank pool, so it runs once (`once`: with the world sizes that include the
smallest default one), and it compiles every kernel cold in a private cache: about 135 s
on a GPU machine's CPU while other tests ran beside it, so it carries its own timeout,
above the suite's per-test one (bench/gpu_suite.sh: --timeout 150)."""
import importlib

import pytest
from triton.runtime.jit import KernelInterface

from trident.ccl import registry

from .. import algorithms
from ..conftest import once
from . import run_check, run_python

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


def registry_kernels(ops=registry.OPS) -> dict[str, str]:
    """{module.kernel: "op name"} of every kernel (a @triton.jit or Gluon function named
    *_kernel) that the file of an algorithm of trident/ccl/registry.py defines."""
    out = {}
    for op, name in algorithms.pairs(ops):
        module = importlib.import_module(f"trident.ccl.{registry.get(op, name).module}")
        found = [k for k, v in vars(module).items() if k.endswith("_kernel")
                 and isinstance(v, KernelInterface) and v.fn.__module__ == module.__name__]
        out.update({f"{module.__name__}.{k}": f"{op} {name}" for k in found})
        if not found:
            out[f"{module.__name__} (defines no *_kernel)"] = f"{op} {name}"
    return out


def unlisted(listed, ops=registry.OPS) -> dict[str, str]:
    """registry_kernels() that the sm_90 list (`listed`: its module.kernel labels) lacks."""
    listed = set(listed)
    return {k: v for k, v in registry_kernels(ops).items() if k not in listed}


def sm90_labels() -> list[str]:
    """The module.kernel labels of tests/compile/sm90.py's list (nothing compiled), read
    in a process of its own, as the compile is (sm90.py sets the GPU mode first)."""
    code = "from tests.compile import sm90; print(*(k.label for k in sm90.kernels()))"
    proc = run_python("-c", code, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.split()


@once
def test_every_registry_algorithm_has_sm90_entries():
    """Every kernel of every algorithm in trident/ccl/registry.py has an entry in the
    sm_90 list (the registry against the list: nothing compiled), so a new algorithm
    fails here until its kernels get theirs."""
    missing = unlisted(sm90_labels())
    assert not missing, (f"kernels of registry algorithms with no entry in "
                         f"tests/compile/sm90.py (_ccl): {missing}")
