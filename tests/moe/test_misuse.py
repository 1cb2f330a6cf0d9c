"""Misuse of ExpertParallel's API that used to give silently wrong results or an obscure
error, and now raises a named one on every rank that should, quickly:

  - combine of a Dispatched that another ExpertParallel's dispatch returned: it combined
    this object's own round instead (the round counters of two objects agree), silently.
    ValueError naming it (`Dispatched._owner`).
  - combine of PendingDispatch.result before its .wait(): it combined rows not received
    yet, silently. RuntimeError saying to call .wait() first (`Dispatched._receiving`).
  - dispatch, combine or a pending .wait() after ctx.close(): an InterpreterError of the
    unmapped heap. The context's own "this trident Context is closed" (plans.check_open).
  - ranks that disagree on where the weights are (one rank keeps them from dispatch, the
    others pass new ones to combine): where the rank that keeps them has no token (so the
    others wait for no weights of it) each side summed with other weights, silently; on
    both paths with tokens everywhere both sides waited until their timeout. Now the
    combine's fingerprint holds it (plans.combine), and the receivers of a rank that kept
    its weights watch the sources' weights flags: CallMismatch on every rank, or
    PeerFailed naming it, at once, with the outputs NaN.

Where only the last rank misuses, its peers' correct call stops at once naming it
(fail_call), not at their timeout. After ctx.reset() on every rank (or in a new context),
a correct round is right against plain torch."""
import pytest
import torch

import trident as td
from trident.runtime.errors import CallMismatch, PeerFailed

from ..conftest import WORLD_SIZES, get_pool
from ..faults.mismatch import attempt
from .test_expert_parallel import (_check_dispatch, _reference_combine, _round_inputs,
                                   _run_experts)

WORLDS = [w for w in WORLD_SIZES if w in (2, 4)] or [2]
TIMEOUT = 10.0       # the sub-contexts' device timeout
QUICK = TIMEOUT / 2  # every rank raises within this (a wait that timed out would not)
K, H, M = 2, 32, 4   # top-k, hidden dim, max tokens per rank
DTYPE = torch.float32
NAMED = (CallMismatch.__name__, PeerFailed.__name__)


@pytest.fixture(params=WORLDS, ids=lambda w: f"world{w}")
def pool(request):
    return get_pool(request.param)


def _ep(ctx, **kw):
    return td.ExpertParallel(ctx, 2 * ctx.world_size, K, H, M, dtype=DTYPE, **kw)


def _inputs(ctx, ep, seed, counts=None):
    """(every rank's inputs, a, b, and this rank's x, idx, w on the device)."""
    ranks, a, b = _round_inputs(seed, ctx.world_size, ep.num_experts, K, H, M, DTYPE,
                                counts or [M] * ctx.world_size)
    _, x, idx, w = ranks[ctx.rank]
    return ranks, a, b, x.to(ctx.device), idx.to(ctx.device), w.to(ctx.device)


def _right(ctx, ep, seed, split=False, weights_at_dispatch=False):
    """A correct round on `ep`, checked against plain torch."""
    ranks, a, b, x, idx, w = _inputs(ctx, ep, seed)
    kw = dict(topk_weights=w) if weights_at_dispatch else {}
    h = ep.dispatch(x, idx, wait=not split, **kw)
    d = h.wait() if split else h
    _check_dispatch(ctx, d, ranks, ep.num_local_experts)
    ey = _run_experts(ctx, d, ep.num_local_experts, a, b, DTYPE)
    h = ep.combine(ey, d, None if weights_at_dispatch else w, wait=not split)
    y = h.wait() if split else h
    T, xc, ic, wc = ranks[ctx.rank]
    torch.testing.assert_close(y.cpu(), _reference_combine(T, xc, ic, wc, a, b, DTYPE))


def _then_right(sub, call, *rounds):
    """attempt(call) and sync; then, after sub.reset(), each of `rounds` ((ep, seed, kw))
    is a correct round; every ExpertParallel closed. Returns the attempt."""
    got = attempt(lambda: (call(), sub.sync()))
    sub.reset()
    for ep, seed, kw in rounds:
        _right(sub, ep, seed, **kw)
    for ep in {id(r[0]): r[0] for r in rounds}.values():
        ep.close()
    return got


def _misusing(ctx, who: str) -> bool:
    return who == "every" or ctx.rank == ctx.world_size - 1


def _assert_raised(results, who: str, kind: str, phrase: str) -> None:
    """`results`: every rank's attempt (kind, text, seconds). The misusing ranks raised
    `kind` naming `phrase`; the others (who == "last") PeerFailed or CallMismatch naming
    the last rank and reset(); all within QUICK."""
    last = len(results) - 1
    every = "\n".join(f"rank {r}: {x}" for r, x in enumerate(results))
    for rank, (k, text, took) in enumerate(results):
        assert took < QUICK, f"rank {rank} took {took:.2f} s\n{every}"
        if who == "every" or rank == last:
            assert k == kind and phrase in text, every
        else:
            assert k in NAMED and f"rank {last}" in text and "reset()" in text, every


# ---------------------------------------------------------------- another's Dispatched
def _another_ones_dispatched(ctx, who):
    with td.init(heap_size=8 << 20, group=ctx.group, timeout=TIMEOUT) as sub:
        ep1, ep2 = _ep(sub), _ep(sub)         # same shape: their round counters agree
        _, a, b, x, idx, w = _inputs(sub, ep1, 1)
        d1 = ep1.dispatch(x, idx)
        ep2.dispatch(*_inputs(sub, ep2, 2)[3:5])
        ey = _run_experts(sub, d1, ep1.num_local_experts, a, b, DTYPE)
        ep = ep2 if _misusing(sub, who) else ep1
        return _then_right(sub, lambda: ep.combine(ey, d1, w), (ep1, 3, {}), (ep2, 4, {}))


@pytest.mark.parametrize("who", ["every", "last"])
def test_combine_of_another_expert_parallels_dispatch_raises(pool, who):
    _assert_raised(pool.run(_another_ones_dispatched, who), who, "ValueError",
                   "combine: d was returned by the dispatch of another ExpertParallel")


# ---------------------------------------------------------------- before .wait()
def _before_wait(ctx, who):
    with td.init(heap_size=8 << 20, group=ctx.group, timeout=TIMEOUT) as sub:
        ep = _ep(sub)
        _right(sub, ep, 1)                    # a round before: its rows are in expert_x
        _, a, b, x, idx, w = _inputs(sub, ep, 2)
        pending = ep.dispatch(x, idx, wait=False)
        if _misusing(sub, who):
            d = pending.result                # the receive half is not queued yet
        else:
            d = pending.wait()
        ey = _run_experts(sub, d, ep.num_local_experts, a, b, DTYPE)
        return _then_right(sub, lambda: ep.combine(ey, d, w), (ep, 3, dict(split=True)),
                           (ep, 4, {}))


@pytest.mark.parametrize("who", ["every", "last"])
def test_combine_before_the_pending_dispatch_waited_raises(pool, who):
    _assert_raised(pool.run(_before_wait, who), who, "RuntimeError",
                   "Call .wait() on the PendingDispatch first")


# ---------------------------------------------------------------- closed context
def _after_context_close(ctx):
    """close() is collective: every rank's context closes, and each call after it is
    refused on the host of its own rank (no peer is left waiting for it). `ep` holds a
    dispatch not combined yet, `ep2` a dispatch(wait=False) whose receive half is due."""
    sub = td.init(heap_size=8 << 20, group=ctx.group, timeout=TIMEOUT)
    ep, ep2 = _ep(sub), _ep(sub)
    _, a, b, x, idx, w = _inputs(sub, ep, 1)
    d = ep.dispatch(x, idx)
    ey = _run_experts(sub, d, ep.num_local_experts, a, b, DTYPE)
    pending = ep2.dispatch(x, idx, wait=False)
    sub.close()
    got = [attempt(lambda: ep.dispatch(x, idx)), attempt(lambda: ep.combine(ey, d, w)),
           attempt(pending.wait)]
    with td.init(heap_size=8 << 20, group=ctx.group, timeout=TIMEOUT) as again:
        ep = _ep(again)
        _right(again, ep, 2)
        ep.close()
    return got


def test_calls_after_the_context_closed_raise_its_error(pool):
    for rank, calls in enumerate(pool.run(_after_context_close)):
        for what, (kind, text, took) in zip(("dispatch", "combine", "pending.wait()"), calls):
            assert (kind, text) == ("RuntimeError", "this trident Context is closed"), \
                f"rank {rank}, {what}: {kind}: {text[:300]}"
            assert took < QUICK, (rank, what, took)


# ---------------------------------------------------------------- weights disagree
def _weights_disagree(ctx, high_throughput, tokens, split):
    """Every rank dispatches with its weights; at combine the last rank keeps them (no
    topk_weights), the others pass other ones. tokens "empty": the last rank has none."""
    with td.init(heap_size=8 << 20, group=ctx.group, timeout=TIMEOUT) as sub:
        ep = _ep(sub, high_throughput=high_throughput)
        last = sub.rank == sub.world_size - 1
        counts = [M] * sub.world_size
        if tokens == "empty":
            counts[-1] = 0
        _, a, b, x, idx, w = _inputs(sub, ep, 1, counts)
        d = ep.dispatch(x, idx, topk_weights=w)
        ey = _run_experts(sub, d, ep.num_local_experts, a, b, DTYPE)
        ys = []

        def call():
            h = ep.combine(ey, d, None if last else 2 * w, wait=not split)
            ys.append(h.wait() if split else h)
            sub.sync()

        got = attempt(call)
        y = ys[0] if ys else None
        poisoned = y is None or y.numel() == 0 or bool(y.isnan().all())
        sub.reset()
        _right(sub, ep, 2)
        _right(sub, ep, 3, weights_at_dispatch=True)
        _right(sub, ep, 4, split=True, weights_at_dispatch=True)
        ep.close()
    return (*got, poisoned)


@pytest.mark.parametrize("high_throughput,tokens,split", [
    (False, "empty", False), (False, "empty", True), (False, "full", False),
    (False, "full", True), (True, "empty", False), (True, "empty", True),
    (True, "full", False)],
    ids=["low_latency-empty", "low_latency-empty-split", "low_latency-full",
         "low_latency-full-split", "ht-empty", "ht-empty-split", "ht-full"])
def test_weights_at_dispatch_on_one_rank_at_combine_on_others_raise(
        pool, high_throughput, tokens, split):
    results = pool.run(_weights_disagree, high_throughput, tokens, split)
    every = "\n".join(f"rank {r}: {x}" for r, x in enumerate(results))
    for rank, (kind, text, took, poisoned) in enumerate(results):
        assert kind in NAMED, every
        assert "moe_combine" in text and "different call" in text, every
        assert took < QUICK, f"rank {rank} took {took:.2f} s\n{every}"
        assert poisoned, f"rank {rank}: plausible outputs of a mismatched combine\n{every}"


# ---------------------------------------------------------------- arguments differ
def _made_differently(ctx, field):
    """The last rank makes its ExpertParallel with another hidden size, or for another
    number of SMs (its programs differ: 2 against 3 on the CPU emulation)."""
    last = ctx.rank == ctx.world_size - 1
    kw = dict(hidden_dim=2 * H if last else H) if field == "hidden_dim" else \
        dict(hidden_dim=H, num_sms=1 if last else None)
    got = attempt(lambda: td.ExpertParallel(ctx, 2 * ctx.world_size, K, max_num_tokens=M,
                                            dtype=DTYPE, **kw))
    ep = _ep(ctx)                 # nothing was allocated: the heaps still agree
    _right(ctx, ep, 5)
    ep.close()
    ctx.barrier()
    return got


@pytest.mark.parametrize("field,said", [
    ("hidden_dim", ["hidden_dim: rank 0 {h}, ", "rank {last} {h2})"]),
    ("num_sms", ["programs: rank 0", "pass the same num_sms"])])
def test_arguments_that_differ_between_ranks_are_named_on_every_rank(pool, field, said):
    results = pool.run(_made_differently, field)
    every = "\n".join(f"rank {r}: {x}" for r, x in enumerate(results))
    for rank, (kind, text, took) in enumerate(results):
        assert kind == "ValueError", every
        assert "the ranks made it with different arguments" in text, every
        assert all(p.format(h=H, h2=2 * H, last=len(results) - 1) in text
                   for p in said), every
        assert took < QUICK, every
