"""The command line (`python -m trident`, as the `trident` script): info, demo, `bench --help`,
`tune --help`, `trace --help`, and a tiny run of two benchmark suites, which must write
their results (to --out-dir, else ./trident-results) with the baseline, named for what it
is, beside every trident row. On the CPU emulation by default, unchanged on GPUs."""
import json
import os
import subprocess
import sys

import pytest

from trident.runtime.launch import default_backend

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _trident(*args, timeout=600, cwd=ROOT, ok=True):
    """Run the command line in a subprocess of this environment: its stdout, asserting that
    it succeeded; with ok=False, its stdout and stderr, asserting that it failed."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "trident", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if not ok:
        assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        return proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def test_info():
    assert "trident backend:" in _trident("info")


@pytest.mark.parametrize("world", [1, 2])
def test_demo_checks_every_part(world):
    out = _trident("demo", "--world-size", str(world))
    for part in ("ring:", "atomics:", "all_reduce:", "all_gather:", "matmul_all_reduce:",
                 "moe dispatch+combine:"):
        assert part in out, (part, out)
    assert out.count(": ok") == 6, out


def test_bench_help_says_what_each_suite_measures():
    from trident.tools.cli import SUITES
    out = _trident("bench", "--help")
    assert "./trident-results" in out, out
    for suite, what in SUITES.items():
        assert f"  {suite} " in out and what.split()[0] in out, (suite, out)


@pytest.mark.parametrize("command, flags", [
    ("tune", ("--gemm", "--ops", "--budget-s", "--world-size", "--quick", "--max-size", "--out")),
    ("trace", ("--output", "--world-size", "--size", "--dtype", "--iters", "--tokens")),
])
@pytest.mark.parametrize("help_flag", ["--help", "-h"])
def test_tune_and_trace_help_show_every_option(command, flags, help_flag):
    """`trident tune --help` printed only `usage: trident tune [-h]` (issue 41): the
    command's own parser must answer, with every option it takes."""
    out = _trident(command, help_flag)
    assert f"usage: trident {command}" in out, out
    for flag in flags:
        assert flag in out, (flag, out)


@pytest.mark.parametrize("suite, args, baseline", [
    ("ccl", ["--ops", "all_reduce", "--max-size", "1K", "--iters", "1", "--warmup", "0"],
     "gloo" if default_backend() == "cpu" else "nccl"),
    ("p2p", ["--iters", "1", "--size", "4096"], None),     # no --out-dir: ./trident-results
])
def test_bench_writes_results(tmp_path, suite, args, baseline):
    if suite == "ccl":
        _trident("bench", suite, "--world-size", "2", "--out-dir", str(tmp_path), *args)
        folder = tmp_path
    else:
        _trident("bench", suite, "--world-size", "2", *args, cwd=str(tmp_path))
        folder = tmp_path / "trident-results"
    [path] = [p for p in folder.iterdir() if p.suffix == ".json"]
    result = json.loads(path.read_text())
    assert result["backend"] == default_backend() and result["world_size"] == 2 and result["date"]
    impls = {r["impl"] for r in result["rows"]}
    assert any(i.startswith("trident") for i in impls), impls
    if baseline:
        assert baseline in impls and not {"nccl", "gloo"} - {baseline} & impls, impls


def test_quickstart_example_runs():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "examples/quickstart.py"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "[((32, 48), (10, 64)), ((32, 48), (10, 64))]" in proc.stdout, proc.stdout
