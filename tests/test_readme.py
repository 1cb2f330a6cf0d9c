"""The README can not rot: its code blocks that run as copied do (the device language's
ring kernel here, at world 2 on the test backend; the quickstart is examples/quickstart.py
character for character, which tests/test_cli.py runs); its result tables, docs/results.md
and bench/results/README.md are what bench/make_results.py generates from the committed
JSON; its table of environment variables is the user's variables of
trident/runtime/options.py, and docs/options.md has the tests' too; and it stays within
250 lines."""
import glob
import importlib.util
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "README.md")) as _f:
    README = _f.read()
# the blocks meant to run: a whole script, ending in the __main__ guard
SCRIPTS = [b for b in re.findall(r"```python\n(.*?)```", README, re.S)
           if 'if __name__ == "__main__":' in b]


def _make_results():
    spec = importlib.util.spec_from_file_location(
        "make_results", os.path.join(ROOT, "bench", "make_results.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_has_its_two_scripts():
    assert len(SCRIPTS) == 2, [s[:80] for s in SCRIPTS]
    assert "ExpertParallel" in SCRIPTS[0] and "@triton.jit" in SCRIPTS[1]


def test_the_ring_kernel_runs_as_copied(tmp_path):
    path = tmp_path / "ring.py"           # run from elsewhere: nothing but trident needed
    path.write_text(SCRIPTS[1])
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "[103.0, 3.0]" in proc.stdout, proc.stdout   # rank r got rank r-1's last block


def test_the_quickstart_is_the_example_file():
    """tests/test_cli.py runs examples/quickstart.py (and checks its output): so the README's
    quickstart runs as copied, and is run once only."""
    with open(os.path.join(ROOT, "examples", "quickstart.py")) as f:
        assert f.read() == SCRIPTS[0], "copy the README's quickstart into examples/quickstart.py"


def test_generated_tables_match_the_committed_json():
    for path, text in _make_results().generate().items():
        with open(path) as f:
            assert f.read() == text, (f"{os.path.relpath(path, ROOT)} is not what the JSON in "
                                      f"bench/results/ gives: run python bench/make_results.py")


def test_the_readme_lists_the_users_variables():
    """The README's table holds the user's variables (trident/runtime/options.py, kind
    "user") and no other; every other TRIDENT_* variable, the tests' included (a name in
    quotes in tests/), is in docs/options.md (tests/test_options.py: the package's are
    declared)."""
    from trident.runtime import options
    rows = "\n".join(line for line in README.splitlines() if line.startswith("| `TRIDENT_"))
    listed = {"TRIDENT_" + v for v in re.findall(r"`(?:TRIDENT)?_([A-Z0-9_]+)", rows)}
    users = {v.name for v in options.TRIDENT if v.kind == "user"}
    assert listed == users, (f"README's table of environment variables: lacks "
                             f"{sorted(users - listed)}, has more: {sorted(listed - users)}")
    with open(os.path.join(ROOT, "docs", "options.md")) as f:
        page = f.read()
    found = set()
    for path in glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True):
        with open(path) as f:
            found |= set(re.findall(r"[\"'](TRIDENT_[A-Z0-9_]+)[\"']", f.read()))
    missing = sorted(v for v in found if f"`{v}" not in page)
    assert found and not missing, f"docs/options.md lacks the tests' variables {missing}"


def test_the_readme_stays_a_guide():
    """Issue 32: at most 250 lines; what grows goes to docs/ (status, history, results)."""
    lines = README.count("\n")
    assert lines <= 250, f"README.md has {lines} lines (at most 250): move detail to docs/"
