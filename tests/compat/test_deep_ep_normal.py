"""trident.compat.deep_ep's normal mode, checked the way DeepEP's own
tests/legacy/test_intranode.py checks DeepEP, on the CPU emulation (and GPUs).

Every rank builds every rank's inputs from one seed (one rank has no tokens, some top-k
entries are -1, an odd hidden size) and checks: get_dispatch_layout against torch;
dispatch's received rows per source rank (handle[0], the rank prefix matrix) bit for bit
and in the source's order, the received top-k ids as local experts (-1 elsewhere) and
weights, the source indices, the tokens per local expert (aligned), FP8 tuples, a cached
dispatch (handle given), num_worst_tokens padding; combine's unweighted sum over the
ranks a token went to, its weights' sum and bias. Bad inputs raise on every rank.
"""
import pytest
import torch

from trident.compat import deep_ep

H, K, MAXT = 168, 3, 6       # hidden (a multiple of 8, not of 128), top-k, tokens per rank


def _inputs(seed, world, E):
    """(x [T, H] bf16, topk_idx [T, K] int64 with some -1, topk_weights fp32) per rank;
    the first rank has no tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in range(world):
        T = 0 if r == 0 else int(torch.randint(1, MAXT + 1, (), generator=g))
        x = torch.randn(T, H, generator=g).to(torch.bfloat16)
        idx = torch.rand(T, E, generator=g).argsort(dim=1)[:, :K]
        if T > 1:
            idx[1, 0] = -1
        w = torch.rand(T, K, generator=g) + 0.1
        out.append((x, idx, w))
    return out


def _in_rank(idx, E, R):
    """is_token_in_rank [T, R] of topk_idx, in plain Python."""
    L = E // R
    m = torch.zeros(idx.shape[0], R, dtype=torch.bool)
    for t in range(idx.shape[0]):
        for e in idx[t].tolist():
            if e >= 0:
                m[t, e // L] = True
    return m


def _normal(ctx):
    R, me, dev = ctx.world_size, ctx.rank, ctx.device
    E = 3 * R
    L = E // R
    config = deep_ep.Buffer.get_dispatch_config(R) if R in (2, 4, 8) else None
    hint = deep_ep.Config(20, 6, 256).get_nvl_buffer_size_hint(H * 2, R)
    buf = deep_ep.Buffer(ctx.group, hint, 0)
    try:
        ranks = _inputs(11, R, E)
        x, idx, w = (t.to(dev) for t in ranks[me])
        masks = [_in_rank(i, E, R) for _, i, _ in ranks]
        # layout, against torch
        per_rank, rdma, per_expert, in_rank, event = buf.get_dispatch_layout(idx, E)
        assert rdma is None and in_rank.dtype == torch.bool and per_rank.dtype == torch.int32
        assert torch.equal(in_rank.cpu(), masks[me])
        assert per_rank.cpu().tolist() == masks[me].sum(0).tolist()
        want = [int((ranks[me][1] == e).sum()) for e in range(E)]
        assert per_expert.dtype == torch.int32 and per_expert.cpu().tolist() == want
        # dispatch with top-k
        recv_x, recv_idx, recv_w, counts, handle, event = buf.dispatch(
            x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w,
            expert_alignment=2, config=config, async_finish=True,
            previous_event=buf.capture())
        event.current_stream_wait()
        sources = [(s, t) for s in range(R) for t in range(ranks[s][0].shape[0])
                   if masks[s][t, me]]
        assert recv_x.dtype == torch.bfloat16 and tuple(recv_x.shape) == (len(sources), H)
        prefix = handle[0].cpu()
        assert prefix[-1, me] == len(sources) and prefix.dtype == torch.int32
        for i, (s, t) in enumerate(sources):
            assert prefix[s - 1, me] <= i < prefix[s, me] if s else i < prefix[0, me]
            assert torch.equal(recv_x[i].cpu(), ranks[s][0][t]), f"row {i} from rank {s}"
            assert int(handle[3][i]) == t
            g = ranks[s][1][t]
            local = (g >= me * L) & (g < me * L + L)
            assert recv_idx[i].cpu().tolist() == torch.where(local, g - me * L, -1).tolist()
            assert torch.equal(recv_w[i].cpu(), torch.where(local, ranks[s][2][t], 0.0))
        total = [sum(int((i == me * L + j).sum()) for _, i, _ in ranks) for j in range(L)]
        assert counts == [-(-c // 2) * 2 for c in total]
        # combine: each rank sends back its rows times (rank + 1); the sums come back
        back = (recv_x.float() * (me + 1)).to(torch.bfloat16)
        bias = (torch.ones(x.shape[0], H, dtype=torch.bfloat16, device=dev),
                torch.full((x.shape[0], H), 0.5, dtype=torch.bfloat16, device=dev))
        out, out_w, event = buf.combine(back, handle, topk_weights=recv_w, bias=bias)
        ref = torch.zeros(x.shape[0], H)
        for r in range(R):
            part = (x.float().cpu() * (r + 1)).to(torch.bfloat16).float()
            ref += torch.where(masks[me][:, r:r + 1], part, 0.0)
        ref = (ref + 1.0 + 0.5).to(torch.bfloat16)
        assert out.dtype == torch.bfloat16 and torch.equal(out.cpu(), ref)
        assert torch.equal(out_w.cpu(), torch.where(ranks[me][1] >= 0, ranks[me][2], 0.0))
        # FP8 tuple (scales column-major, as DeepEP's test), no top-k; then cached (BF16)
        q = x.float().clamp(-4, 4).to(torch.float8_e4m3fn)
        sc = x[:, :H // 8].float().abs().t().contiguous().t()     # column-major
        (rq, rs), none_idx, none_w, counts8, h8, _ = buf.dispatch(
            (q, sc), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert)
        assert none_idx is None and none_w is None and counts8 == total
        assert rq.dtype == torch.float8_e4m3fn and rs.dtype == torch.float32
        for i, (s, t) in enumerate(sources):
            qs = ranks[s][0][t].float().clamp(-4, 4).to(torch.float8_e4m3fn)
            assert torch.equal(rq[i].cpu().view(torch.uint8), qs.view(torch.uint8))
            assert torch.equal(rs[i].cpu(), ranks[s][0][t][:H // 8].float().abs())
        again, *nothing, event = buf.dispatch(x, handle=h8)
        assert torch.equal(again, recv_x) and nothing == [None, None, None, h8]
        # num_worst_tokens: padded outputs, ids -1 in the padding, no counts
        worst = MAXT * R
        wx, widx, ww, wcounts, _, _ = buf.dispatch(
            x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w,
            num_worst_tokens=worst)
        n = len(sources)
        assert wcounts == [] and wx.shape[0] == widx.shape[0] == ww.shape[0] == worst
        assert torch.equal(wx[:n], recv_x) and torch.equal(widx[:n], recv_idx)
        assert bool((widx[n:] == -1).all())
        _refusals(buf, x, idx, w, per_rank, in_rank, per_expert, handle, E)
    finally:
        buf.destroy()


def _refusals(buf, x, idx, w, per_rank, in_rank, per_expert, handle, E):
    """Errors every rank raises together (the layout all_gather carries every rank's
    checks), and NotImplementedError for what DeepEP offers and trident does not."""
    args = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                num_tokens_per_expert=per_expert)
    bad = idx.clone()
    if buf.rank == buf.group_size - 1 and bad.shape[0]:
        bad[0, 0] = E + 5
    with pytest.raises(ValueError, match=f"rank {buf.group_size - 1}'s topk_idx holds ids"):
        buf.dispatch(x, topk_idx=bad, topk_weights=w, **args)
    wrong = per_rank.clone()
    if buf.rank == 1:
        wrong[0] += 1
    with pytest.raises(ValueError, match="rank 1's num_tokens_per_rank differs"):
        buf.dispatch(x, **dict(args, num_tokens_per_rank=wrong))
    with pytest.raises(NotImplementedError, match="num_tokens_per_rdma_rank"):
        buf.dispatch(x, num_tokens_per_rdma_rank=per_rank, **args)
    with pytest.raises(NotImplementedError, match="channel"):
        handle[1]
    with pytest.raises(ValueError, match="takes no topk_idx"):
        buf.dispatch(x, handle=handle, topk_idx=idx, topk_weights=w)


def test_normal_like_deepep(pool2):
    pool2.run(_normal)
