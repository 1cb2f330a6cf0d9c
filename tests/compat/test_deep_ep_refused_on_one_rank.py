"""DeepEP's low-latency calls refused on one rank only (an argument trident does not take,
stats of the wrong shape, a handle that is not one): the check runs before the
ExpertParallel call, so the peers' dispatch waited for that rank until its timeout. Now
they stop at once with PeerFailed naming it, and after ctx.reset() a round is right."""
import pytest
import torch

from trident.compat import deep_ep

from ..faults.mismatch import assert_refused_on_the_last_rank, attempt

H, K, M = 128, 2, 4
TIMEOUT = 10.0


def _refused(ctx, what):
    last = ctx.world_size - 1
    E = 2 * ctx.world_size
    old = ctx.timeout_s
    ctx.set_timeout(TIMEOUT)
    buf = deep_ep.Buffer(ctx.group, low_latency_mode=True,
                         num_rdma_bytes=deep_ep.Buffer.get_low_latency_rdma_size_hint(
                             M, H, ctx.world_size, E))
    try:
        g = torch.Generator().manual_seed(ctx.rank)
        x = torch.randn(M, H, generator=g).to(torch.bfloat16).to(ctx.device)
        idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(M)]).to(ctx.device)
        w = torch.rand(M, K, generator=g).to(ctx.device)

        def dispatch(bad=False):
            stats = torch.zeros(E // ctx.world_size + (1 if bad else 0), dtype=torch.int32,
                                device=ctx.device)
            return buf.low_latency_dispatch(x, idx, M, E, use_fp8=False,
                                            cumulative_local_expert_recv_stats=stats)
        dispatch()                       # both ExpertParallel objects made, plans warm
        dispatch()
        ctx.sync()
        bad = ctx.rank == last
        if what == "stats":
            got = attempt(lambda: (dispatch(bad), ctx.sync()))
        else:
            recv, _, handle, _, _ = dispatch()
            got = attempt(lambda: (buf.low_latency_combine(recv, idx, w, "h" if bad else handle),
                                   ctx.sync()))
        ctx.reset()
        recv, _, handle, _, _ = dispatch()
        y, _, _ = buf.low_latency_combine(recv, idx, w, handle)
        ctx.sync()
        torch.testing.assert_close(y.float(), x.float() * w.sum(1, keepdim=True),
                                   rtol=2e-2, atol=2e-2)
        return got
    finally:
        buf.destroy()
        ctx.set_timeout(old)


@pytest.mark.parametrize("what", ["stats", "handle"])
def test_refused_on_one_rank_stops_the_others_at_once(pool2, what):
    refused = ("cumulative_local_expert_recv_stats must be" if what == "stats"
               else "handle must be what low_latency_dispatch returned")
    results = pool2.run(_refused, what)
    if what == "handle":         # TypeError there
        results = [("ValueError",) + tuple(r[1:]) if r[0] == "TypeError" else r
                   for r in results]
    assert_refused_on_the_last_rank(results, refused, TIMEOUT / 2, peers=("PeerFailed",))
