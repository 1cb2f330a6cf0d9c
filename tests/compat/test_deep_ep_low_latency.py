"""trident.compat.deep_ep's low-latency calls, checked the way DeepEP's own
tests/legacy/test_low_latency.py checks DeepEP, on the CPU emulation (and GPUs).

Every rank builds every rank's inputs from one seed (one rank has no tokens; some top-k
entries are -1) and checks: each local expert receives exactly the rows routed to it
(as a multiset: the content of each token's row, bit for bit in BF16; in FP8 the e4m3
bytes and scales trident.moe.fp8.quantize gives, within e4m3 precision of the token),
recv_count per expert, DeepEP's shapes, dtypes and column-major scale layout, the
cumulative stats, and combine's weighted sums against plain torch. Modes: async_finish
with its event, return_recv_hook with hook(), two dispatches in flight (DeepEP's two
buffers), zero_copy, a given `out`. Unsupported arguments raise NotImplementedError.
"""
from collections import Counter

import pytest
import torch
import torch.distributed as dist

from trident.torch import backend as torch_backend
from trident.compat import deep_ep
from trident.moe import fp8

H, K, M = 256, 3, 4          # hidden (two FP8 scale groups), top-k, max tokens per rank


def _inputs(seed, world, E):
    """(x [T, H] bf16, topk_idx [T, K] int64 with some -1, topk_weights [T, K]) per rank;
    the last rank has no tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in range(world):
        T = 0 if r == world - 1 else int(torch.randint(1, M + 1, (), generator=g))
        x = (torch.randn(T, H, generator=g) + r).to(torch.bfloat16)
        idx = torch.rand(T, E, generator=g).argsort(dim=1)[:, :K]
        if T:
            idx[0, K - 1] = -1                   # no expert (DeepEP's convention)
        w = torch.rand(T, K, generator=g) + 0.1
        out.append((x, idx, w))
    return out


def _key(q, s=None):
    b = q.contiguous().view(torch.uint8).numpy().tobytes()
    return b if s is None else b + s.contiguous().view(torch.int32).numpy().tobytes()


def _scale(e):
    return 1.0 + e / 8                        # expert e's "computation": y = x * scale


def _check_dispatch(rank, recv_x, count, ranks, L, E, use_fp8):
    R = len(ranks)
    if use_fp8:
        q, s = recv_x
        assert q.dtype == torch.float8_e4m3fn and tuple(q.shape) == (L, M * R, H)
        assert s.dtype == torch.float32 and tuple(s.shape) == (L, M * R, H // 128)
        assert s.stride(1) == 1 and s.stride(2) == M * R     # DeepEP: column-major scales
    else:
        assert recv_x.dtype == torch.bfloat16 and tuple(recv_x.shape) == (L, M * R, H)
    assert count.dtype == torch.int32 and tuple(count.shape) == (L,)
    cnt = count.cpu().tolist()
    ref = [fp8.quantize(x) for x, _, _ in ranks] if use_fp8 else None
    for le in range(L):
        e = rank * L + le
        routed = [(r, t) for r, (x, idx, _) in enumerate(ranks) for t in range(x.shape[0])
                  if e in idx[t].tolist()]
        assert cnt[le] == len(routed), f"expert {e}: {cnt[le]} rows, expected {len(routed)}"
        n = cnt[le]
        if use_fp8:
            q, s = recv_x[0][le, :n].cpu(), recv_x[1][le, :n].cpu()
            want = Counter(_key(ref[r][0][t], ref[r][1][t]) for r, t in routed)
            assert Counter(_key(q[i], s[i]) for i in range(n)) == want, f"expert {e}"
            for r, t in routed:   # dequantised: within e4m3 precision of the token
                orig = ranks[r][0][t].float()
                err = (fp8.dequantize(ref[r][0][t], ref[r][1][t]) - orig).abs()
                bound = orig.abs() * 2.0 ** -4 + ref[r][1][t].repeat_interleave(128) * 2.0 ** -10
                assert bool((err <= bound).all()), f"expert {e}: dequantised row too far off"
        else:
            got = Counter(_key(recv_x[le, i].cpu()) for i in range(n))
            assert got == Counter(_key(ranks[r][0][t]) for r, t in routed), f"expert {e}"


def _experts(rank, recv_x, count, L, use_fp8):
    """The experts' outputs [L, M * R, H] bf16: each valid row times its expert's scale."""
    x = fp8.dequantize(recv_x[0], recv_x[1]) if use_fp8 else recv_x.float()
    y = torch.zeros(x.shape, dtype=torch.bfloat16, device=x.device)
    for le, n in enumerate(count.cpu().tolist()):
        y[le, :n] = (x[le, :n] * _scale(rank * L + le)).to(torch.bfloat16)
    return y


def _check_combine(out, x, idx, w, use_fp8):
    """out[t] = sum_k w[t, k] * scale(idx[t, k]) * x[t] over the k with idx != -1."""
    xs = fp8.dequantize(*fp8.quantize(x)) if use_fp8 else x.float()
    ref = torch.zeros(x.shape[0], H)
    for t in range(x.shape[0]):
        for j in range(K):
            e = int(idx[t, j])
            if e >= 0:
                y = (xs[t] * _scale(e)).to(torch.bfloat16).float()
                ref[t] += w[t, j] * y
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (x.shape[0], H)
    torch.testing.assert_close(out.float().cpu(), ref, atol=5e-2, rtol=2e-2)


def _low_latency(ctx):
    R, rank, dev = ctx.world_size, ctx.rank, ctx.device
    E = 2 * R
    L = E // R
    group = ctx.group
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(M, H, R, E)
    buf = deep_ep.Buffer(group, 0, hint, low_latency_mode=True, num_qps_per_rank=L)
    assert buf.ctx is ctx and buf.group_size == R and buf.rank == rank
    try:
        ranks = _inputs(7, R, E)
        x, idx, w = (t.to(dev) for t in ranks[rank])
        stats = torch.zeros(L, dtype=torch.int32, device=dev)
        # 1. BF16, async_finish: the event is waited for
        recv_x, count, handle, event, hook = buf.low_latency_dispatch(
            x, idx, M, E, cumulative_local_expert_recv_stats=stats, use_fp8=False,
            async_finish=True)
        assert hook is None and isinstance(event, deep_ep.EventOverlap)
        event.current_stream_wait()
        _check_dispatch(rank, recv_x, count, ranks, L, E, False)
        assert torch.equal(stats, count)
        assert (handle[2], handle[3], handle[4]) == (M, H, E)
        y = _experts(rank, recv_x, count, L, False)
        out, event, hook = buf.low_latency_combine(y, idx, w, handle)
        assert hook is None and event.event is None
        _check_combine(out, *ranks[rank], False)
        # 2. two in flight: A (FP8, hook) and B (BF16) dispatched, then A received, then
        #    B and A combined (DeepEP's two buffers); A's stats added at its hook
        ranks_b = _inputs(8, R, E)
        xb, idxb, wb = (t.to(dev) for t in ranks_b[rank])
        ra, ca, ha, _, hook_a = buf.low_latency_dispatch(
            x, idx, M, E, cumulative_local_expert_recv_stats=stats, return_recv_hook=True)
        with pytest.raises(ValueError, match="hook"):
            buf.low_latency_combine(y, idx, w, ha)     # its data has not been received
        rb, cb, hb, _, _ = buf.low_latency_dispatch(xb, idxb, M, E, use_fp8=False)
        hook_a()
        _check_dispatch(rank, ra, ca, ranks, L, E, True)
        _check_dispatch(rank, rb, cb, ranks_b, L, E, False)
        assert torch.equal(stats, 2 * ca)
        given = torch.empty(xb.shape[0], H, dtype=torch.bfloat16, device=dev)
        out_b, _, hook_b = buf.low_latency_combine(_experts(rank, rb, cb, L, False), idxb, wb,
                                                   hb, out=given, return_recv_hook=True)
        assert out_b is given
        hook_b()
        _check_combine(out_b, *ranks_b[rank], False)
        # zero_copy: the experts write into the buffer combine reads
        buf.get_next_low_latency_combine_buffer(ha)[:] = _experts(rank, ra, ca, L, True)
        out_a, _, _ = buf.low_latency_combine(torch.empty(0), idx, w, ha, zero_copy=True)
        _check_combine(out_a, *ranks[rank], True)
        # 3. a bad id (not -1) is dropped and raised at the next barrier, on every rank
        bad = idx.clone()
        if bad.shape[0]:
            bad[0, 0] = 10 ** 6
        buf.low_latency_dispatch(x, bad, M, E, use_fp8=False)
        if bad.shape[0]:
            with pytest.raises(ValueError, match="not an expert id"):
                ctx.sync()
        ctx.barrier()
        _refusals(buf, x, idx, w, handle, M, E)
    finally:
        buf.destroy()


def _refusals(buf, x, idx, w, handle, M, E):
    """What DeepEP offers and trident does not: NotImplementedError naming the argument;
    DeepEP's own argument errors: ValueError. None of these launches anything."""
    for kw, name in ((dict(round_scale=True), "round_scale"), (dict(use_ue8m0=True), "ue8m0"),
                     (dict(dispatch_wait_recv_cost_stats=torch.zeros(2, dtype=torch.int64)),
                      "dispatch_wait_recv_cost_stats")):
        with pytest.raises(NotImplementedError, match=name):
            buf.low_latency_dispatch(x, idx, M, E, **kw)
    with pytest.raises(ValueError, match="async_finish and return_recv_hook"):
        buf.low_latency_dispatch(x, idx, M, E, async_finish=True, return_recv_hook=True)
    with pytest.raises(NotImplementedError, match="use_logfmt"):
        buf.low_latency_combine(x, idx, w, handle, use_logfmt=True)
    with pytest.raises(NotImplementedError, match="combine_wait_recv_cost_stats"):
        buf.low_latency_combine(x, idx, w, handle,
                                combine_wait_recv_cost_stats=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(NotImplementedError, match="recv_src_info"):
        handle[0]
    # one hidden size per (M, num_experts): another is ExpertParallel's ValueError (on
    # every rank: each makes the same call; nothing is launched)
    with pytest.raises(ValueError, match=rf"x must be \[T, {H}\]"):
        buf.low_latency_dispatch(torch.zeros(x.shape[0], 128, dtype=x.dtype, device=x.device),
                                 idx, M, E, use_fp8=False)
    for kw, name in ((dict(num_rdma_bytes=1 << 20), "num_rdma_bytes"),
                     (dict(allow_mnnvl=True), "allow_mnnvl"),
                     (dict(enable_shrink=True), "enable_shrink"),
                     (dict(low_latency_mode=True, allow_nvlink_for_low_latency_mode=False),
                      "allow_nvlink_for_low_latency_mode"),
                     (dict(comm=object()), "comm")):
        with pytest.raises(NotImplementedError, match=name):
            deep_ep.Buffer(buf.group, **kw)
    normal = deep_ep.Buffer(buf.group)           # no collective: the context is reused
    with pytest.raises(ValueError, match="low_latency_mode"):
        normal.low_latency_dispatch(x, idx, M, E)
    with pytest.raises(NotImplementedError, match="shrink"):
        buf.low_latency_update_mask_buffer(0, True)
    # the Buffer's methods with no meaning here, and the internode size hint
    for call, name in ((buf.get_comm_stream, "get_comm_stream"),
                       (lambda: buf.get_local_buffer_tensor(torch.bfloat16),
                        "get_local_buffer_tensor"),
                       (lambda: buf.internode_dispatch(x), "internode_dispatch"),
                       (lambda: buf.internode_combine(x), "internode_combine"),
                       (lambda: deep_ep.Config(20, 6, 256).get_rdma_buffer_size_hint(
                           H * 2, 16), "num_ranks > 8")):
        with pytest.raises(NotImplementedError, match=name):
            call()
    assert deep_ep.Config(20, 6, 256).get_rdma_buffer_size_hint(H * 2, 8) == 0


def test_low_latency_like_deepep(pool2):
    pool2.run(_low_latency)


def _on_trident_group(ctx):
    """Buffer over a process group of backend "trident" (trident.torch.backend) runs on
    that group's own context (no second heap); one BF16 round, checked."""
    R, rank, dev = ctx.world_size, ctx.rank, ctx.device
    E = 2 * R
    g = dist.new_group(list(range(R)), backend="trident",
                       pg_options=torch_backend.Options(heap_size=64 << 20))
    buf = deep_ep.Buffer(g, 0, deep_ep.Buffer.get_low_latency_rdma_size_hint(M, H, R, E),
                         low_latency_mode=True)
    try:
        assert buf.ctx is g.context() and buf.ctx is not ctx
        ranks = _inputs(9, R, E)
        x, idx, w = (t.to(dev) for t in ranks[rank])
        recv_x, count, handle, _, _ = buf.low_latency_dispatch(x, idx, M, E, use_fp8=False)
        _check_dispatch(rank, recv_x, count, ranks, 2, E, False)
        out, _, _ = buf.low_latency_combine(_experts(rank, recv_x, count, 2, False), idx, w,
                                            handle)
        _check_combine(out, *ranks[rank], False)
    finally:
        buf.destroy()


def test_low_latency_on_a_trident_process_group(pool2):
    pool2.run(_on_trident_group)
