"""ExpertParallel arguments refused on one rank only, where the check runs outside a plan's
build: the constructor's (its peers allocate the buffers and wait in its barrier) and
combine's check of `d`. The peers stop at once naming a mismatch or the refusal, not at
their timeout (the constructor's peers waited in the barrier until HostTimeout, after
which the process group was unusable, and kept buffers that no object owned, so that
reset() found the heaps different), and after reset() on every rank a round is right."""
import pytest
import torch

import trident as td

from ..faults.mismatch import assert_refused_on_the_last_rank, attempt

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


def _refused_on_one_rank(ctx, what):
    last = ctx.world_size - 1
    E = 2 * ctx.world_size
    with td.init(heap_size=8 << 20, group=ctx.group, timeout=TIMEOUT) as sub:
        if what == "constructor":
            got = attempt(lambda: td.ExpertParallel(
                sub, num_experts=E + (1 if sub.rank == last else 0), experts_per_token=2,
                hidden_dim=32, max_num_tokens=8))
            sub.reset()
            ep = td.ExpertParallel(sub, E, 2, 32, 8)
        else:
            ep = td.ExpertParallel(sub, E, 2, 32, 8)
            old, w = _round(sub, ep)
            d = ep.dispatch(*_inputs(sub, ep))
            got = attempt(lambda: (ep.combine(d.expert_x, old if sub.rank == last else d, w),
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
    assert_refused_on_the_last_rank(
        pool.run(_refused_on_one_rank, what),
        "must be a multiple of the world size" if what == "constructor"
        else "d is from an earlier dispatch", TIMEOUT / 2)
