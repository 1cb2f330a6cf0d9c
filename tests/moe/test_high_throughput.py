"""The high-throughput path (trident/moe/high_throughput.py) at small sizes: the same
checks as test_expert_parallel.py / test_fp8_dispatch.py, with every ExpertParallel made
on that path (its threshold, ctx.options.moe_ht_min_tokens, set to 0 for the test), plus
routing that stresses its chunks: uneven counts per rank (none, one, a partial chunk, a
full batch), every token to one expert, and tokens that reach only their own rank; and the
fused combine's one-pass receive (this rank's own experts summed from expert_y, the other
ranks' partials read once) against an independent torch reference and against the staged
combine it replaced (plans.HT_COMBINE_STAGED), deterministic from call to call.
"""
import dataclasses

import pytest
import torch

import trident as td
from trident.moe import buffers as B
from trident.moe import plans
from trident.runtime.launch import default_backend

from .test_expert_parallel import (_back_to_back, _check_combine, _check_dispatch,
                                   _graph_replay, _rounds, _round_inputs, _run_experts)
from .test_fp8_dispatch import _distinct, _fp8_rounds


def _ht(ctx, fn, *args):
    """Run fn(ctx, *args) with every new ExpertParallel on the high-throughput path."""
    old = ctx.options
    ctx.options = dataclasses.replace(old, moe_ht_min_tokens=0)
    try:
        return fn(ctx, *args)
    finally:
        ctx.options = old


def _routing_cases(ctx, E, k, H, M, dtype):
    E = max(E // ctx.world_size, 1) * ctx.world_size
    L = E // ctx.world_size
    ep = td.ExpertParallel(ctx, E, k, H, M, dtype=dtype)
    assert ep.high_throughput
    w_ = ctx.world_size
    # counts per rank: none, a full batch, one token, a partial chunk; then uneven again
    plans = [([0, M, 1, B.CHUNK_TOKENS + 1][:w_] + [M] * (w_ - 4), "random"),
             ([M] * w_, "one_expert"),
             (([M - 1, 0] + [B.CHUNK_TOKENS] * (w_ - 2))[:w_], "own_rank"),
             ([M] * w_, "skewed")]
    try:
        for i, (counts, kind) in enumerate(plans):
            ranks, a, b = _round_inputs(700 + i, w_, E, k, H, M, dtype, counts)
            edited = []
            for r, (T, x, idx, w) in enumerate(ranks):
                if kind == "one_expert":      # every token of every rank to expert 1
                    idx = _distinct(torch.cat([torch.ones(T, 1, dtype=idx.dtype),
                                               idx[:, 1:]], 1), E)
                elif kind == "own_rank" and L >= k:   # only experts of the token's rank
                    idx = (r * L + torch.arange(k).repeat(T, 1)).to(idx.dtype)
                elif kind == "skewed":        # rank 0's experts get most tokens
                    idx = _distinct(torch.cat([idx[:, :1] % L, idx[:, 1:]], 1), E)
                edited.append((T, x, idx, w))
            ranks = edited
            T, x, idx, w = ranks[ctx.rank]
            early = i % 2 == 1
            d = ep.dispatch(x.to(ctx.device), idx.to(ctx.device),
                            topk_weights=w.to(ctx.device) if early else None)
            _check_dispatch(ctx, d, ranks, L)
            ey = _run_experts(ctx, d, L, a, b, dtype)
            y = ep.combine(ey, d, None if early else w.to(ctx.device))
            _check_combine(y, T, x, idx, w, a, b, dtype)
        ctx.barrier()
    finally:
        ep.close()


def test_ht_matches_reference(pool):
    # first round: rank 0 sends nothing, rank 1 a full batch (not a multiple of CHUNK)
    pool.run(_ht, _rounds, 12, 3, 96, 2 * B.CHUNK_TOKENS + 3, torch.bfloat16, [11, 12])


def test_ht_routing_cases(pool):
    pool.run(_ht, _routing_cases, 12, 2, 64, 2 * B.CHUNK_TOKENS + 1, torch.bfloat16)


def test_ht_split_mode(pool):
    pool.run(_ht, _rounds, 12, 2, 64, 6, torch.bfloat16, [31, 32, 33], torch.int64, True)


def test_ht_back_to_back_and_reset(pool):
    pool.run(_ht, _back_to_back, 8)
    pool.run(_ht, _rounds, 12, 2, 64, 5, torch.bfloat16, [21, 22], torch.int64, False, True)


def test_ht_fp8(pool):
    pool.run(_ht, _fp8_rounds, 8, 2, 256, 6, torch.float16, [61, 62], False, True)
    pool.run(_ht, _fp8_rounds, 12, 2, 128, 5, torch.bfloat16, [51, 52], True)


def _staged(ctx, *args, **kwargs):
    """A new ExpertParallel whose fused combine stages its own partials (the old combine)."""
    plans.HT_COMBINE_STAGED = True
    try:
        ep = td.ExpertParallel(ctx, *args, **kwargs)
        assert ep.high_throughput
        return ep
    finally:
        plans.HT_COMBINE_STAGED = False


def _one_pass(ctx, E, k, H, M, dtype):
    """Odd token counts (a rank with none, one with a single token, partial chunks), random
    routing, then half of each rank's tokens only to experts of their own rank (no remote
    part at all): combine with the weights at combine and at dispatch, checked against
    torch on the gathered inputs, bit for bit the same when repeated, and against the
    staged combine (the same sum, its own part rounded once more: close, not equal)."""
    E = max(E // ctx.world_size, 1) * ctx.world_size
    L = E // ctx.world_size
    w_ = ctx.world_size
    ep = td.ExpertParallel(ctx, E, k, H, M, dtype=dtype)
    old = _staged(ctx, E, k, H, M, dtype=dtype)
    assert ep.high_throughput
    odd = [[0, M, 1, B.CHUNK_TOKENS + 3], [M, 2 * B.CHUNK_TOKENS - 1, 0, 3]]
    try:
        for i, counts in enumerate(odd):
            counts = [min(c, M) for c in (counts * w_)[:w_]]
            ranks, a, b = _round_inputs(900 + i, w_, E, k, H, M, dtype, counts)
            if i == 1 and L >= k:     # every other token only to its own rank's experts
                ranks = [(T, x, torch.where((torch.arange(T) % 2 == 0)[:, None],
                                            r * L + torch.arange(k), idx), w)
                         for r, (T, x, idx, w) in enumerate(ranks)]
            T, x, idx, w = ranks[ctx.rank]
            x, idx, w = x.to(ctx.device), idx.to(ctx.device), w.to(ctx.device)
            for early in (False, True):
                d = ep.dispatch(x, idx, topk_weights=w if early else None)
                _check_dispatch(ctx, d, ranks, L)
                ey = _run_experts(ctx, d, L, a, b, dtype)
                y = ep.combine(ey, d, None if early else w)
                _check_combine(y, T, x.cpu(), idx.cpu(), w.cpu(), a, b, dtype)
                again = ep.combine(ey, d, None if early else w)
                assert torch.equal(y.view(torch.int16), again.view(torch.int16)), \
                    "the one-pass combine differs from itself on the same inputs"
                d2 = old.dispatch(x, idx, topk_weights=w if early else None)
                y2 = old.combine(_run_experts(ctx, d2, L, a, b, dtype), d2,
                                 None if early else w)
                _check_combine(y2, T, x.cpu(), idx.cpu(), w.cpu(), a, b, dtype)
                tol = 2e-2
                torch.testing.assert_close(y.float(), y2.float(), atol=tol, rtol=tol)
        ctx.barrier()
    finally:
        old.close()
        ep.close()


def test_ht_one_pass_combine(pool):
    pool.run(_ht, _one_pass, 12, 3, 96, 2 * B.CHUNK_TOKENS + 3, torch.bfloat16)
    pool.run(_ht, _one_pass, 16, 2, 80, B.CHUNK_TOKENS + 1, torch.float16)


def _empty_rank_combines(ctx, E, k, H, M, dtype):
    """Rank 0 has no token, the weights come with dispatch, and one dispatch is combined
    three times over new expert outputs (scaled by 1, 2, 4) while the other ranks sleep
    before each combine. Rank 0's combines then have nothing to wait for but chunk 0's
    flags (high_throughput.py): without those, it ran two epochs ahead and overwrote the
    half of a peer's partial buffer that the peer was still to read."""
    import time
    E = max(E // ctx.world_size, 1) * ctx.world_size
    L = E // ctx.world_size
    ep = td.ExpertParallel(ctx, E, k, H, M, dtype=dtype)
    assert ep.high_throughput
    try:
        counts = [0] + [M] * (ctx.world_size - 1)
        ranks, a, b = _round_inputs(950, ctx.world_size, E, k, H, M, dtype, counts)
        T, x, idx, w = ranks[ctx.rank]
        d = ep.dispatch(x.to(ctx.device), idx.to(ctx.device), topk_weights=w.to(ctx.device))
        _check_dispatch(ctx, d, ranks, L)
        outs = []
        for scale in (1.0, 2.0, 4.0):
            ey = _run_experts(ctx, d, L, a * scale, b * scale, dtype)
            if ctx.rank:
                time.sleep(0.5)
            outs.append((scale, ep.combine(ey, d)))
        for scale, y in outs:
            _check_combine(y, T, x, idx, w, a * scale, b * scale, dtype)
        ctx.barrier()
    finally:
        ep.close()


def test_ht_empty_rank_does_not_run_ahead(pool):
    pool.run(_ht, _empty_rank_combines, 12, 3, 64, B.CHUNK_TOKENS + 1, torch.bfloat16)


@pytest.mark.skipif(default_backend() != "cuda", reason="CUDA graphs need GPUs")
def test_ht_graph_replay(pool):
    pool.run(_ht, _graph_replay, 10)
