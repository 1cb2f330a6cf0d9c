"""trident.launch on its own (RankPool, which launch() wraps): world sizes, results in
rank order, a rank's exception (type, rank, traceback) re-raised in the caller, a run
that hangs stopped as an error, and what the pool cannot send. The shared pools do most
of it; one fresh 1-rank pool covers what closes a pool. Faults inside ops and the
launcher's signals are in tests/faults/."""
import pickle
import time

import pytest

from trident.runtime.launch import RankPool, check_world_size, default_world_size, launch

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


@pytest.mark.parametrize("bad", [0, -1, -4])
def test_world_size_must_be_positive(bad):
    """0 is not "the default" (None is): it and negatives raise before any rank starts."""
    with pytest.raises(ValueError, match=f"world_size must be at least 1.*got {bad}"):
        RankPool(bad, backend="cpu")
    with pytest.raises(ValueError, match="at least 1"):
        launch(_whoami, bad, "x", backend="cpu")


@pytest.mark.parametrize("bad", [2.0, "2", True, [2]])
def test_world_size_must_be_an_int(bad):
    with pytest.raises(TypeError, match=f"world_size must be an int.*got {type(bad).__name__}"):
        RankPool(bad, backend="cpu")
    with pytest.raises(TypeError, match="world_size must be an int"):
        launch(_whoami, bad, backend="cpu")


def test_world_size_none_is_the_default():
    import numpy as np
    assert check_world_size(None) is None
    assert default_world_size("cpu") == 4
    assert check_world_size(np.int64(3)) == 3 and type(check_world_size(np.int64(3))) is int
    with pytest.raises(ValueError, match="backend must be one of"):
        RankPool(2, backend="gpu")


def test_cli_world_size_is_checked(capsys):
    from trident.tools.cli import main
    for bad, why in (("0", "must be at least 1"), ("-2", "must be at least 1"),
                     ("two", "must be an integer")):
        with pytest.raises(SystemExit):
            main(["demo", "--world-size", bad])
        assert why in capsys.readouterr().err


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


def _last_call_fails_unsynced(ctx):
    """A warm all_reduce, then one whose sizes differ between the ranks, and nothing that
    synchronises after it: the error is pending when fn returns."""
    import torch
    t = torch.ones(8, device=ctx.device)
    ctx.all_reduce(t)
    ctx.barrier()
    ctx.all_reduce(torch.ones(8 if ctx.rank == 0 else 16, device=ctx.device))
    return ctx.rank


def test_an_error_pending_at_the_last_close_is_raised():
    """An error that a rank's context raises only at its final close (the last call failed
    and nothing synchronised after it) is raised by launch(), on the caller's side. Before,
    launch returned the results and the error went to the ranks' stderr alone."""
    from trident.runtime.errors import CallMismatch
    t0 = time.monotonic()
    with pytest.raises(CallMismatch, match="all_reduce") as info:
        launch(_last_call_fails_unsynced, 2, backend="cpu", heap_size=1 << 20, timeout=10.0)
    notes = "\n".join(info.value.__notes__)
    assert "while it ran the close of its context" in notes, notes
    assert time.monotonic() - t0 < 60


class _GaveUp(Exception):
    """What a caller's own timeout raises in its thread (pytest-timeout raises Failed)."""


def _sleeps_then_says(ctx, seconds, word):
    time.sleep(seconds)
    return word


def test_a_run_given_up_on_never_answers_the_next(pool):
    """A run the caller abandons (its own timer raised while the ranks still ran: on a GPU,
    pytest-timeout's Failed did) answers later; that late answer is not the next run's.
    Before requests were numbered, the reset took the late answer for its own and the next
    run returned the reset's None on every rank (tests/fuzz/test_ops.py on one H200)."""
    import signal
    import threading

    def give_up(signum, frame):
        raise _GaveUp()

    # SIGUSR1 from a timer thread, not SIGALRM: the real-time timer is pytest-timeout's,
    # and setting it here would cancel the suite's bound on this test
    old = signal.signal(signal.SIGUSR1, give_up)
    timer = threading.Timer(0.5, signal.pthread_kill,
                            (threading.main_thread().ident, signal.SIGUSR1))
    timer.start()
    try:
        with pytest.raises(_GaveUp):
            pool.run(_sleeps_then_says, 2.0, "late")
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGUSR1, old)
    w = pool.world_size
    assert pool.run(_whoami, "next") == [(r, w, "next") for r in range(w)]
