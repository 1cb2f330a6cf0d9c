"""trident/bench/common.py's time_modes_interleaved, at world 1 on the tests' backend: the
eager batches of several implementations are taken in turns (batch 1 of each, then batch
2 of each), each gets time_modes' columns, and one that raises is a skip row while the
others go on."""
from trident.bench import common

from .conftest import get_pool


def _interleaved(ctx):
    log = []

    def impl(name):
        return lambda: log.append(name)

    def broken():
        raise RuntimeError("no such size here")

    fns = {"a": impl("a"), "broken": broken, "b": impl("b")}
    out = common.time_modes_interleaved(ctx, fns, calls=2, reps=3, warmup=1, graph=False)
    return log, out


def test_eager_batches_are_taken_in_turns_and_a_failure_is_a_skip_row():
    log, out = get_pool(1).run(_interleaved)[0]
    assert list(out) == ["a", "broken", "b"]
    # each warm-up (on a GPU also _calls_for's two probe calls), then the batches of 2
    # calls in turns
    assert log[0] == "a" and log[-12:] == ["a", "a", "b", "b"] * 3, log
    for name in ("a", "b"):
        row = out[name]
        assert row["eager_us"] > 0 and row["host_us"] > 0 and row["calls"], row
    assert out["broken"]["eager_us"] is None
    assert out["broken"]["graph_note"] == "skipped: RuntimeError"
