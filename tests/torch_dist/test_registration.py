"""Backend "trident" is registered by `import trident`, `trident info` says so and what
falls back, and examples/torch_backend.py runs under torchrun with a device map
("cuda:trident,cpu:gloo": trident's device to trident, the rest to gloo), giving the
single-process reference's output on both ranks."""
import os
import re
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import trident
from trident.tools.info import info

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_import_registers_the_backend_and_info_says_so(capsys):
    assert trident.torch.backend.registered()
    assert "TRIDENT" in dist.Backend._plugins
    assert trident.torch.backend.register()           # again: a no-op
    info()
    out = capsys.readouterr().out
    assert "torch.distributed backend 'trident': registered" in out, out
    assert "Falls back" in out and "send, recv" in out, out


def _reference_sum() -> float:
    """examples/torch_backend.py's MLP output, unsharded, in this process."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
    return round(model(x).sum().item(), 3)


def test_example_under_torchrun_with_a_device_map(tmp_path):
    env = dict(os.environ, TRIDENT_BACKEND="cpu", TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("LOCAL_WORLD_SIZE", None)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         os.path.join(ROOT, "examples", "torch_backend.py"), "--backend", "cuda:trident,cpu:gloo"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    where = f"{done.stdout}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, where
    want = _reference_sum()
    # the ranks' lines may interleave (two processes writing one pipe)
    lines = re.findall(r"rank (\d): all_reduce (\d+\.\d+) tp output sum (-?\d+\.\d+)", done.stdout)
    assert sorted(int(r) for r, _, _ in lines) == [0, 1], where
    for rank, total, got in lines:
        assert float(total) == 3.0 and abs(float(got) - want) < 2e-3, (rank, got, want, where)
