"""DeepEP's low-latency calls refused on one rank only (an argument trident does not take,
stats of the wrong shape, a handle that is not one): the check runs before the
ExpertParallel call, so the peers' dispatch waited for that rank until its timeout. Now
they stop at once with PeerFailed naming it, and after ctx.reset() a round is right."""
import contextlib

import pytest
import torch

from trident.compat import deep_ep

from ..faults.mismatch import assert_refused_on_the_last_rank, attempt

H, K, M = 128, 2, 4
TIMEOUT = 10.0


@contextlib.contextmanager
def _buffer(ctx, *args, **kwargs):
    """deep_ep.Buffer(ctx.group, *args, **kwargs) with the context's timeout at TIMEOUT,
    and this rank's inputs: x [M, H] bf16, top-k ids over 2 * world experts, weights.
    Destroyed, and the timeout restored, after."""
    old = ctx.timeout_s
    ctx.set_timeout(TIMEOUT)
    buf = deep_ep.Buffer(ctx.group, *args, **kwargs)
    try:
        g = torch.Generator().manual_seed(ctx.rank)
        E = 2 * ctx.world_size
        x = torch.randn(M, H, generator=g).to(torch.bfloat16).to(ctx.device)
        idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(M)]).to(ctx.device)
        w = torch.rand(M, K, generator=g).to(ctx.device)
        yield buf, x, idx, w
    finally:
        buf.destroy()
        ctx.set_timeout(old)



def _refused(ctx, what):
    last = ctx.world_size - 1
    E = 2 * ctx.world_size
    size = deep_ep.Buffer.get_low_latency_rdma_size_hint(M, H, ctx.world_size, E)
    with _buffer(ctx, low_latency_mode=True, num_rdma_bytes=size) as (buf, x, idx, w):
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


@pytest.mark.parametrize("what", ["stats", "handle"])
def test_refused_on_one_rank_stops_the_others_at_once(pool2, what):
    refused = ("cumulative_local_expert_recv_stats must be" if what == "stats"
               else "handle must be what low_latency_dispatch returned")
    results = pool2.run(_refused, what)
    if what == "handle":         # TypeError there
        results = [("ValueError",) + tuple(r[1:]) if r[0] == "TypeError" else r
                   for r in results]
    assert_refused_on_the_last_rank(results, refused, TIMEOUT / 2, peers=("PeerFailed",))


def _refused_normal(ctx, what):
    """DeepEP's normal mode: the last rank's dispatch gets a 3-D x, or its combine float16
    top-k weights; the check runs before any exchange (Buffer._dispatch_inputs, combine's
    checks), so without the hand-over its peers waited in the layout's all_gather or the
    move until their timeout."""
    R, last = ctx.world_size, ctx.world_size - 1
    size = deep_ep.Config(20, 6, 256).get_nvl_buffer_size_hint(H * 2, R)
    with _buffer(ctx, size, 0) as (buf, x, idx, w):
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, 2 * R)

        def dispatch(x):
            return buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                                num_tokens_per_expert=per_expert, topk_idx=idx,
                                topk_weights=w)
        bad = ctx.rank == last
        if what == "dispatch":
            got = attempt(lambda: (dispatch(x[None] if bad else x), ctx.sync()))
        else:
            recv_x, _, recv_w, _, handle, _ = dispatch(x)
            ww = recv_w.half() if bad else recv_w
            got = attempt(lambda: (buf.combine(recv_x, handle, topk_weights=ww), ctx.sync()))
        ctx.reset()
        recv_x, _, _, _, handle, _ = dispatch(x)
        out, _, _ = buf.combine(recv_x, handle)
        ctx.sync()
        times = in_rank.sum(1, keepdim=True).to(torch.float32)   # one copy back per rank
        torch.testing.assert_close(out.float(), (x.float() * times).to(torch.bfloat16).float(),
                                   rtol=2e-2, atol=2e-2)
        return got


@pytest.mark.parametrize("what", ["dispatch", "combine"])
def test_normal_mode_refused_on_one_rank_stops_the_others_at_once(pool2, what):
    refused = "dispatch: x must be a [num_tokens, hidden]" if what == "dispatch" \
        else "combine: topk_weights must be float32"
    assert_refused_on_the_last_rank(pool2.run(_refused_normal, what), refused, TIMEOUT / 2,
                                    peers=("PeerFailed",))
