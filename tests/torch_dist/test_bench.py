"""trident/bench/torch_backend.py in brief, in the test ranks: its host rows are there and
sane (a warm dist.all_reduce on a heap tensor neither builds a plan nor synchronises,
and the backend's layer costs a few microseconds at most, generously bounded for a loaded
machine), and its TP MLP step over trident gives the baseline group's output."""
import pytest

from trident.bench.torch_backend import measure, summary


def test_bench_rows(tpool):
    if tpool.world_size != 2:
        pytest.skip("one world is enough")
    rows = tpool.run(measure, 400, 50, (4, 16, 32), 1)[0]
    layer = rows["group.allreduce heap"]["ns"] - rows["ctx.all_reduce heap"]["ns"]
    assert 0 < rows["ctx.all_reduce heap"]["ns"] < rows["dist.all_reduce heap"]["ns"], rows
    assert layer < 20_000, f"the backend's layer took {layer:.0f} ns per call"
    assert rows["tp mlp output rel err (trident vs gloo)"]["value"] < 1e-5, rows
    assert "dist.all_reduce - ctx.all_reduce" in summary(rows)
