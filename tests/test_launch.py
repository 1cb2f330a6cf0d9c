"""trident.launch on its own (RankPool, which launch() wraps): world sizes, results in
rank order, a rank's exception (type, rank, traceback) re-raised in the caller, a run
that hangs stopped as an error, and what the pool cannot send. The shared pools do most
of it; one fresh 1-rank pool covers what closes a pool. Faults inside ops and the
launcher's signals are in tests/faults/."""
import pickle
import time

import pytest

from trident.launch import RankPool

from .faults.procs import alive


def _whoami(ctx, tag):
    return ctx.rank, ctx.world_size, tag


def _fails_on_last_rank(ctx):
    if ctx.rank == ctx.world_size - 1:
        _deep_failure(ctx.rank)
    return ctx.rank


def _deep_failure(rank):
    raise KeyError(f"no such thing on rank {rank}")


def _unpicklable_result(ctx):
    return lambda: ctx.rank


def _sleeps(ctx, seconds):
    time.sleep(seconds)


def test_results_come_back_in_rank_order(pool):
    w = pool.world_size
    assert pool.run(_whoami, "x") == [(r, w, "x") for r in range(w)]


def test_a_rank_exception_carries_its_rank_and_traceback(pool):
    w = pool.world_size
    with pytest.raises(KeyError, match=f"no such thing on rank {w - 1}") as info:
        pool.run(_fails_on_last_rank)
    notes = "\n".join(info.value.__notes__)
    assert f"raised on rank {w - 1} of {w} while it ran _fails_on_last_rank" in notes, notes
    assert "_deep_failure" in notes and "Traceback" in notes, notes     # the rank's frames
    assert pool.run(_whoami, "after") == [(r, w, "after") for r in range(w)]   # still usable


def test_what_cannot_travel_is_named(pool):
    with pytest.raises(TypeError, match="picklable"):
        pool.run(lambda ctx: 0)
    with pytest.raises((TypeError, AttributeError, pickle.PicklingError)):
        pool.run(_unpicklable_result)
    assert len(pool.run(_whoami, 0)) == pool.world_size


def test_world_size_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        RankPool(-1, backend="cpu")


def test_one_rank_and_a_run_past_its_timeout():
    """World size 1 works; a run past its timeout is a TimeoutError naming the ranks, and
    the ranks are stopped (one fresh pool: the timeout closes it)."""
    pool = RankPool(1, backend="cpu", heap_size=1 << 20, timeout=5.0)
    pids = pool.pids
    try:
        assert pool.run(_whoami, "solo") == [(0, 1, "solo")]
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"_sleeps: rank\(s\) \[0\] did not finish "
                                               r"within 1 s"):
            pool.run(_sleeps, 60, timeout=1.0)
        assert time.monotonic() - t0 < 15
        assert pool.closed and pool.pids == []
        with pytest.raises(RuntimeError, match="closed"):
            pool.run(_whoami, 0)
    finally:
        pool.close(force=True)
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids), "a rank process outlived the timeout"
