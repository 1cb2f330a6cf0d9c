"""What the cases of a call that differs between ranks share (sizes, algorithms): how long
they let a wait run, what a rank saw (`attempt`), and the verdict on what every rank saw."""
import time

from trident.runtime.errors import CallMismatch, PeerFailed

# the cases whose ranks do meet: long enough for a slow peer (4 ranks sharing one GPU's
# host) not to pass for a missing one; a mismatch is found as soon as both ranks arrive,
# so this costs a passing run nothing. (The CommTimeouts these cases gave on GPUs were a
# host word that named a later wait's record instead of the first: language/sync.py.)
MEET = 20.0


def assert_found_when_ranks_meet(results, op: str) -> None:
    """`results`: every rank's (output poisoned, the next call's exception type name and
    message, seconds it took to raise, seconds the mismatched call took)."""
    every = "\n".join(f"rank {r}: call {c:.2f} s, poisoned={p}, next call raised {k} in "
                      f"{t:.2f} s: {x}" for r, (p, k, x, t, c) in enumerate(results))
    for rank, (poisoned, kind, text, took, call_s) in enumerate(results):
        assert poisoned, f"rank {rank}: the output of a mismatched call is not NaN\n{every}"
        # found when the ranks meet, not by a wait that ran out its MEET seconds
        assert call_s < MEET / 2, every
        # the rank that finds the difference raises CallMismatch; a peer that was still
        # waiting for it may stop first on its published error: PeerFailed naming it
        assert kind in (CallMismatch.__name__, PeerFailed.__name__), every
        assert f"rank {rank}: {op}" in text, every
        assert "different call" in text, every    # PeerFailed quotes the peer's CallMismatch
        assert took < 0.5, f"rank {rank}: the next call took {took:.2f} s to raise\n{every}"


def mismatched_call(ctx, call, next_call) -> tuple:
    """Run `call()` (a call the ranks make differently; returns its output) with the
    context's waits limited to MEET, then `next_call()`, then ctx.reset(): what
    assert_found_when_ranks_meet takes (output poisoned, the next call's exception type
    name and message, seconds it took, seconds the call took)."""
    timeout = ctx.timeout_s
    ctx.set_timeout(MEET)
    try:
        t0 = time.perf_counter()
        out = call()
        poisoned = bool(out.isnan().any())       # waits for the kernel
        call_s = time.perf_counter() - t0
        kind, text, took = attempt(next_call)
        ctx.reset()
        return poisoned, kind, text, took, call_s
    finally:
        ctx.set_timeout(timeout)


def attempt(fn) -> tuple[str, str, float]:
    """Run fn() on this rank: (the name of what it raised or "no error", its message, the
    seconds it took), for a test that compares what every rank saw."""
    t0 = time.perf_counter()
    try:
        fn()
        return "no error", "", time.perf_counter() - t0
    except Exception as exc:             # noqa: BLE001 -- the test inspects what came
        return type(exc).__name__, str(exc), time.perf_counter() - t0


def assert_refused_on_the_last_rank(results, refused: str, limit: float,
                                    peers=(CallMismatch.__name__, PeerFailed.__name__)) -> None:
    """`results`: every rank's (kind, text, seconds, ...) of a call that the last rank
    alone refused (ValueError with `refused` in its message). Every rank raised within
    `limit` seconds, the others one of `peers` naming the last rank and ctx.reset()."""
    last = len(results) - 1
    every = "\n".join(f"rank {r}: {x}" for r, x in enumerate(results))
    for rank, (kind, text, took, *_) in enumerate(results):
        assert took < limit, every
        if rank == last:
            assert kind == "ValueError" and refused in text, every
        else:
            assert kind in peers and f"rank {last}" in text and "reset()" in text, every
