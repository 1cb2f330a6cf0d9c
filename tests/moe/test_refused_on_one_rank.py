"""ExpertParallel arguments refused on one rank only, where the check runs outside a plan's
build: the constructor's (its peers allocate the buffers and wait in its barrier) and
combine's check of `d`. The peers stop at once naming a mismatch or the refusal, not at
their timeout (the constructor's peers waited in the barrier until HostTimeout, after
which the process group was unusable, and kept buffers that no object owned, so that
reset() found the heaps different), and after reset() on every rank a round is right."""
import time

import pytest
import torch

import trident as td

TIMEOUT = 10.0


def _round(ctx, ep):
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randn(4, 32, generator=g).to(torch.bfloat16).to(ctx.device)
    idx = torch.stack([torch.randperm(ep.num_experts, generator=g)[:2]
                       for _ in range(4)]).to(ctx.device)
    w = torch.rand(4, 2, generator=g).to(ctx.device)
    d = ep.dispatch(x, idx)
    y = ep.combine(d.expert_x, d, w)
    ctx.sync()
    torch.testing.assert_close(y.float(), x.float() * w.sum(1, keepdim=True),
                               rtol=2e-2, atol=2e-2)
    return d, w


def _attempt(fn):
    t0 = time.perf_counter()
    try:
        fn()
        return "no error", "", time.perf_counter() - t0
    except Exception as exc:             # noqa: BLE001 -- the test inspects what came
        return type(exc).__name__, str(exc), time.perf_counter() - t0


def _refused_on_one_rank(ctx, what):
    last = ctx.world_size - 1
    E = 2 * ctx.world_size
    with td.init(heap_size=8 << 20, group=ctx.group, timeout=TIMEOUT) as sub:
        if what == "constructor":
            got = _attempt(lambda: td.ExpertParallel(
                sub, num_experts=E + (1 if sub.rank == last else 0), experts_per_token=2,
                hidden_dim=32, max_num_tokens=8))
            sub.reset()
            ep = td.ExpertParallel(sub, E, 2, 32, 8)
        else:
            ep = td.ExpertParallel(sub, E, 2, 32, 8)
            old, w = _round(sub, ep)
            d = ep.dispatch(*_inputs(sub, ep))
            got = _attempt(lambda: (ep.combine(d.expert_x, old if sub.rank == last else d, w),
                                    sub.sync()))          # the peers' error comes here
            sub.reset()
        _round(sub, ep)                  # right again
        ep.close()
    return got


def _inputs(ctx, ep):
    g = torch.Generator().manual_seed(10 + ctx.rank)
    x = torch.randn(4, 32, generator=g).to(torch.bfloat16).to(ctx.device)
    idx = torch.stack([torch.randperm(ep.num_experts, generator=g)[:2]
                       for _ in range(4)]).to(ctx.device)
    return x, idx


@pytest.mark.parametrize("what", ["constructor", "combine"])
def test_refused_on_one_rank_stops_the_others_at_once(pool, what):
    if pool.world_size == 1:
        pytest.skip("needs two ranks")
    last = pool.world_size - 1
    results = pool.run(_refused_on_one_rank, what)
    every = "\n".join(f"rank {r}: {x}" for r, x in enumerate(results))
    for rank, (kind, text, took) in enumerate(results):
        assert took < TIMEOUT / 2, every
        if rank == last:
            assert kind == "ValueError", every
            assert ("must be a multiple of the world size" if what == "constructor"
                    else "d is from an earlier dispatch") in text, every
        else:
            assert kind in ("CallMismatch", "PeerFailed"), every
            assert f"rank {last}" in text and "reset()" in text, every
