"""trident under plain torchrun on the CPU emulation (no trident.launch): `td.init()` makes
the process group from torchrun's environment, and a script that ends with ctx.close()
exits cleanly. It used not to, in about 1 run of 3: gloo's worker thread drops a
collective's tensors only after the caller's wait has returned, and needs the GIL to do it;
when close()'s barrier was the script's last collective, that could come after Python had
begun to finalise, and the process died of SIGABRT ("terminate called without an active
exception") after printing correct results. A few short runs, each checked for its exit
code, its output and that message."""
import os
import subprocess
import sys
import textwrap

import pytest

RUNS = 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = textwrap.dedent("""\
    import torch
    import trident as td
    ctx = td.init(heap_size=1 << 20)
    t = torch.full((8,), float(ctx.rank + 1))
    ctx.all_reduce(t)
    out = torch.empty(8 * ctx.world_size)
    ctx.all_gather(out, torch.full((8,), float(ctx.rank)))
    with open(f"rank{ctx.rank}.txt", "w") as f:
        f.write(f"sum {t[0].item()} gathered {out[::8].tolist()}")
    ctx.close()
""")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "two_ranks.py"
    path.write_text(SCRIPT)
    return str(path)


def test_a_torchrun_script_that_closes_exits_cleanly(script, tmp_path):
    # this tree's trident, from the script's folder too (a relative PYTHONPATH would not
    # reach it there, and an installed trident would be run instead)
    env = dict(os.environ, TRIDENT_BACKEND="cpu", TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("LOCAL_WORLD_SIZE", None)
    for run in range(RUNS):
        for r in range(2):
            (tmp_path / f"rank{r}.txt").unlink(missing_ok=True)
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node", "2", script],
            capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
        where = f"run {run + 1} of {RUNS}:\n{done.stdout}\n{done.stderr[-3000:]}"
        assert "terminate called" not in done.stderr, where
        assert done.returncode == 0, where
        for r in range(2):
            assert (tmp_path / f"rank{r}.txt").read_text() == "sum 3.0 gathered [0.0, 1.0]", where
