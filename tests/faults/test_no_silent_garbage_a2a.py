"""all_to_all never yields plausible rows from a call that failed (issue 29), with every
algorithm: ranks whose calls differ (dtype, or the rows one sends another) raise
CallMismatch on every rank -- or PeerFailed naming it, where a wait stopped on the rank
that found it -- and the rows of the peers that differ are NaN; a peer that never calls
leaves its rows NaN and the next call raises at once; after ctx.reset() a correct call is
right."""
import pytest
import torch

from trident.runtime.errors import CallMismatch, CommTimeout, PeerFailed

from .. import algorithms
from ..ccl.refs import assert_equal, rank_inputs
from ..conftest import get_pool
from .test_no_silent_garbage import MEET, MULTI, SHORT, _raises_at_once

ALGORITHMS = algorithms.kernels("all_to_all")     # the registry's (tests/algorithms.py)
NAMED = (CallMismatch.__name__, PeerFailed.__name__)


@pytest.fixture(params=MULTI, ids=lambda w: f"world{w}")
def pool(request):
    return get_pool(request.param)


def _right_after_reset(ctx, algorithm):
    """ctx.reset(), then an uneven all_to_all (rank s sends s + d + 1 rows to rank d) is
    right."""
    ctx.reset()
    w, r = ctx.world_size, ctx.rank
    splits = [[s + d + 1 for d in range(w)] for s in range(w)]
    xs = rank_inputs(w, (sum(splits[-1]), 4), torch.float32, seed=7)
    xs = [x[:sum(splits[s])] for s, x in enumerate(xs)]
    out = torch.zeros(sum(splits[s][r] for s in range(w)), 4, device=ctx.device)
    ctx.all_to_all(out, xs[r].to(ctx.device), out_splits=[splits[s][r] for s in range(w)],
                   in_splits=splits[r], algorithm=algorithm)
    ctx.sync()
    assert_equal(out, torch.cat([xs[s].split(splits[s])[r] for s in range(w)]),
                 f"{algorithm} after reset")


def _call(ctx, algorithm, rows: int, dtype):
    """An even all_to_all of `rows` rows of 4 per peer; returns out (zeros before)."""
    w = ctx.world_size
    inp = torch.randn(rows * w, 4, device=ctx.device).to(dtype)
    out = torch.zeros(rows * w, 4, dtype=dtype, device=ctx.device)
    ctx.all_to_all(out, inp, algorithm=algorithm)
    return out


def _calls_differ(ctx, algorithm, what):
    """Rank 0's call differs from the others': fp16 rows where they send bf16 (the same
    bytes: only the fingerprint tells), or 2 rows per peer where they send 3."""
    odd = ctx.rank == 0
    calls = {"dtype": [(2, torch.float16), (2, torch.bfloat16)],
             "rows": [(2, torch.float32), (3, torch.float32)]}[what]
    for call in calls:          # both built on every rank first: a peer still compiling
        _call(ctx, algorithm, *call)                # would time out
    ctx.sync()
    rows, dtype = calls[0] if odd else calls[1]
    timeout = ctx.timeout_s
    ctx.set_timeout(MEET)
    try:
        out = _call(ctx, algorithm, rows, dtype)
        kind, text, took = _raises_at_once(ctx.barrier)
        # the rows from the peers whose call differs from this rank's
        peers = range(1, ctx.world_size) if odd else [0]
        poisoned = all(bool(out[p * rows:(p + 1) * rows].float().isnan().all()) for p in peers)
        _right_after_reset(ctx, algorithm)
        return kind, text, took, poisoned
    finally:
        ctx.set_timeout(timeout)


@pytest.mark.parametrize("what", ["dtype", "rows"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_calls_that_differ_raise_on_every_rank(pool, algorithm, what):
    for rank, (kind, text, took, poisoned) in enumerate(pool.run(_calls_differ, algorithm,
                                                                 what)):
        assert kind in NAMED, (rank, kind, text)
        assert "all_to_all" in text and "different call" in text, text
        assert took < 5, f"rank {rank}: the barrier took {took:.1f} s to raise"
        assert poisoned, f"rank {rank}: rows of a mismatched all_to_all are not NaN"


def _last_rank_skips(ctx, algorithm):
    """Every rank but the last calls all_to_all; the last never does."""
    timeout = ctx.timeout_s
    ctx.set_timeout(SHORT)
    try:
        result = None
        last = ctx.world_size - 1
        _call(ctx, algorithm, 2, torch.float32)     # the plan and its workspaces, everywhere
        ctx.sync()
        if ctx.rank != last:
            out = _call(ctx, algorithm, 2, torch.float32)
            # reading the rows waits for the launch, whose wait times out after SHORT s: the
            # call after it must raise at once. (Not before: on a GPU the launch is
            # asynchronous, and a call made while it still waits cannot know that it will
            # fail; that call's own launch then returns at once, poisoned, and the call
            # after it raises. The CPU emulation runs the launch inside the call.)
            poisoned = bool(out[2 * last:].isnan().all())
            kind, text, took = _raises_at_once(lambda: _call(ctx, algorithm, 2, torch.float32))
            result = (poisoned, kind, text, took)
        _right_after_reset(ctx, algorithm)
        return result
    finally:
        ctx.set_timeout(timeout)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_timed_out_all_to_all_is_poisoned_and_the_next_call_raises(pool, algorithm):
    for rank, (poisoned, kind, text, took) in enumerate(pool.run(_last_rank_skips,
                                                                 algorithm)[:-1]):
        assert poisoned, f"rank {rank}: the absent rank's rows are not NaN"
        assert kind in (CommTimeout.__name__, PeerFailed.__name__), (rank, kind, text)
        assert "all_to_all" in text, text
        assert took < 0.5, f"rank {rank}: the next call took {took:.2f} s to raise"
