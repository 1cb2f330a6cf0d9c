"""bench/lab/moe_phases.py at world 2 on whatever backend the tests use (the CPU emulation
in CI, where its figures mean nothing): it runs end to end and derives every phase of the
critical path for both ops from the kernels' own trace events."""
from bench.lab import moe_phases

from .conftest import get_pool


def test_moe_phases_runs_and_derives_every_phase():
    result = moe_phases.run(2, calls=2, tokens=(3,), pool=get_pool(2))
    rows = result["rows"]
    assert [r["op"] for r in rows] == ["dispatch", "combine"] * len(moe_phases.MODELS)
    for row in rows:
        for rank in (0, 1):
            m = row["median_us"][rank]
            assert set(m) == {"send", "handoff", "receive", "in-kernel"}, (row["op"], m)
            assert m["in-kernel"] > 0 and m["send"] >= 0 and m["receive"] >= 0
        assert {"wait", "recv", row["op"]} <= set(row["windows_us"][0])
    assert "handoff" in moe_phases.table(rows)
