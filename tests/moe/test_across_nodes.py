"""ExpertParallel over nodes (trident/nodes/expert_parallel.py): the tests of one node's
ExpertParallel, run unchanged on contexts that span nodes, plus what only happens there.

Layouts (tests/nodes.py): on the CPU 4 ranks as 2 nodes x 2 and 4 x 1, and 6 ranks as
2 x 3, gloo between nodes; on one GPU the 4 ranks share it (gloo, through host copies);
on 2-3 GPUs 2 nodes x 1 with NCCL between them. Against plain torch on every rank's
inputs: a rank with no tokens, all tokens to one remote node, FP8, split mode, weights
at dispatch or at combine, bad ids, and a CUDA-graph replay where NCCL carries the rail.
"""
import re
from collections import Counter

import pytest
import torch

import trident as td
from trident.runtime.launch import default_backend
from trident.moe import fp8

from ..faults.mismatch import assert_refused_on_the_last_rank, attempt
from ..nodes import NODE_SIZES, WORLD, Layout, nodes_pool
from .test_expert_parallel import (_back_to_back, _bad_ids, _bad_inputs, _check_combine,
                                   _check_dispatch, _graph_replay, _round_inputs,
                                   _rounds, _run_experts, extreme_counts)
from .test_fp8_dispatch import _edge_rows, _run_experts_fp8


@pytest.fixture(params=NODE_SIZES, ids=lambda n: f"nodes_of_{n}")
def pool(request) -> Layout:
    return Layout(nodes_pool(WORLD, NODE_SIZES[0]), request.param)


@pytest.fixture(scope="module")
def nodes_of_3():
    if default_backend() == "cuda" and torch.cuda.device_count() < 6:
        pytest.skip("2 nodes x 3 on GPUs needs 6 GPUs (the CPU emulation runs it)")
    return nodes_pool(6, 3)


def _kind(ctx):
    ep = td.ExpertParallel(ctx, 2 * ctx.world_size, 2, 32, 3)
    try:
        return type(ep).__name__, ep.node_ep.ctx.world_size, ep.capacity
    finally:
        ep.close()


def test_made_across_nodes(pool):
    for kind, node_world, cap in pool.run(_kind):
        assert (kind, node_world) == ("ExpertParallelAcrossNodes", pool.node_size)
        assert cap == WORLD * 3         # every rank's max_num_tokens, as on one node


def test_the_context_names_its_expert_parallel():
    """td.ExpertParallel(ctx, ...) makes ctx.expert_parallel_class where the context names
    one (a WorldContext: the route across nodes), with every argument; no ranks needed."""
    from trident.nodes.expert_parallel import ExpertParallelAcrossNodes

    class Made:
        def __init__(self, ctx, *args, **kwargs):
            self.ctx, self.args, self.kwargs = ctx, args, kwargs

    class Named:                       # a context that names its own kind
        expert_parallel_class = Made

    ctx = Named()
    ep = td.ExpertParallel(ctx, 8, 2, 32, 4, dtype=torch.float32)
    assert type(ep) is Made and ep.ctx is ctx
    assert (ep.args, ep.kwargs) == ((8, 2, 32, 4), {"dtype": torch.float32})
    assert td.WorldContext.expert_parallel_class is ExpertParallelAcrossNodes
    assert not hasattr(td.Context, "expert_parallel_class")   # one node: ExpertParallel


@pytest.mark.parametrize("E,k,H,dtype", [
    (12, 3, 96, torch.bfloat16),      # several experts per rank, H not a power of two
    (8, 1, 80, torch.float16),        # top-1
], ids=["e12k3h96-bf16", "e8k1h80-fp16"])
def test_matches_reference(pool, E, k, H, dtype):
    pool.run(_rounds, E, k, H, 5, dtype, [11, 12])


def _refused_on_the_last_rank(ctx):
    last, E = ctx.world_size - 1, 2 * ctx.world_size
    got = attempt(lambda: td.ExpertParallel(ctx, E + (1 if ctx.rank == last else 0), 2, 32, 3))
    ctx.reset()
    ep = td.ExpertParallel(ctx, E, 2, 32, 3)        # the heaps agree after the refusal
    ep.close()
    ctx.reset()                                     # a closed one, still referenced: nothing
    return got


def test_refused_on_one_rank_stops_every_node_at_once(pool):
    """The last rank alone refuses its arguments: it raises its ValueError; every other
    rank, on its node and on the others, PeerFailed naming it (world ranks), in seconds
    rather than at the context's 60 s host timeout."""
    results = pool.run(_refused_on_the_last_rank)
    assert_refused_on_the_last_rank(results, "must be a multiple of the world size", 10.0)
    last = len(results) - 1
    for rank, (kind, text, _) in enumerate(results[:last]):   # its error, in world ranks
        assert text.startswith(
            f"rank {rank}: ExpertParallel stopped: rank {last}, which it waited for, failed "
            f"(ExpertParallel, which raised ValueError on rank {last}: ExpertParallel: "
            f"num_experts"), text
        assert len(re.findall(r"rank \d", text)) == 3, text   # none in the node's numbering


def test_split_mode(pool):
    pool.run(_rounds, 8, 2, 64, 4, torch.bfloat16, [31, 32, 33], torch.int32, True)


def test_many_back_to_back_rounds(pool):
    pool.run(_back_to_back, 6)


def test_bad_inputs_and_ids(pool):
    pool.run(_bad_inputs)
    pool.run(_bad_ids)


def _one_remote_node(ctx, seed, M=5):
    """Every token of every rank to experts of the last node only (a node-0 rank's tokens
    all cross the network; the last node's ranks receive everything), k = 2."""
    E, k, H, dtype = 2 * ctx.world_size, 2, 64, torch.bfloat16
    ep = td.ExpertParallel(ctx, E, k, H, M, dtype=dtype)
    L, per_node = 2, 2 * ctx.topology.node_size
    first = E - per_node
    try:
        ranks, a, b = _round_inputs(seed, ctx.world_size, E, k, H, M, dtype,
                                    extreme_counts(ctx.world_size, M))
        g = torch.Generator().manual_seed(seed)
        ranks = [(T, x, first + torch.rand(T, per_node, generator=g).argsort(1)[:, :k], w)
                 for (T, x, idx, w) in ranks]
        T, x, idx, w = ranks[ctx.rank]
        d = ep.dispatch(x.to(ctx.device), idx.to(ctx.device))
        _check_dispatch(ctx, d, ranks, L)
        ey = _run_experts(ctx, d, L, a, b, dtype)
        y = ep.combine(ey, d, w.to(ctx.device))
        _check_combine(y, T, x, idx, w, a, b, dtype)
        ctx.barrier()
    finally:
        ep.close()


def test_all_tokens_to_one_remote_node(pool):
    pool.run(_one_remote_node, 71)


def _key(q):
    return q.contiguous().view(torch.uint8).numpy().tobytes()


def _fp8_rounds(ctx, seeds, split=False):
    """fp8 dispatch: each expert's rows hold exactly the e4m3 bytes of fp8.quantize of the
    tokens routed to it, and scales within 2^-8 of its scales (the forwarding rank
    quantises the dequantised rows again: module docstring); combine as on one node."""
    E, k, H, M, dtype = 2 * ctx.world_size, 2, 256, 4, torch.bfloat16
    ep = td.ExpertParallel(ctx, E, k, H, M, dtype=dtype)
    L = 2
    try:
        for i, seed in enumerate(seeds):
            counts = extreme_counts(ctx.world_size, M) if i == 0 else None
            ranks, a, b = _round_inputs(seed, ctx.world_size, E, k, H, M, dtype, counts)
            if i % 2 == 1:        # a token with a zero group and one of tiny values
                ranks = [(T, _edge_rows(x), idx, w) for (T, x, idx, w) in ranks]
            T, x, idx, w = ranks[ctx.rank]
            x, idx, w = x.to(ctx.device), idx.to(ctx.device), w.to(ctx.device)
            early = i % 2 == 0
            h = ep.dispatch(x, idx, wait=not split, fp8=True, topk_weights=w if early else None)
            d = h.wait() if split else h
            ref = [fp8.quantize(r[1]) for r in ranks]
            cnt = d.expert_num_tokens.cpu()
            for le in range(L):
                e = ctx.rank * L + le
                routed = [(r, t) for r, rk in enumerate(ranks) for t in range(rk[0])
                          if e in rk[2][t].tolist()]
                n = int(cnt[le])
                assert n == len(routed), f"expert {e}: {n} rows, expected {len(routed)}"
                q, s = d.expert_x[le, :n].cpu(), d.expert_x_scale[le, :n].cpu()
                want = {_key(ref[r][0][t]): ref[r][1][t] for r, t in routed}
                assert Counter(_key(q[j]) for j in range(n)) == \
                    Counter(_key(ref[r][0][t]) for r, t in routed), f"expert {e}: e4m3 rows"
                for j in range(n):
                    torch.testing.assert_close(s[j], want[_key(q[j])], rtol=2.0 ** -8, atol=0)
            ey = _run_experts_fp8(ctx, d, L, a, b, dtype)
            y = ep.combine(ey, d, None if early else w)
            xq = fp8.dequantize(*fp8.quantize(x.cpu()))
            _check_combine(y, T, xq, idx.cpu(), w.cpu(), a, b, dtype)
        ctx.barrier()
    finally:
        ep.close()


def test_fp8(pool):
    pool.run(_fp8_rounds, [41, 42, 43])


def test_fp8_split_mode(pool):
    pool.run(_fp8_rounds, [51, 52], True)


def test_two_nodes_of_three(nodes_of_3):
    nodes_of_3.run(_rounds, 12, 3, 96, 5, torch.bfloat16, [13, 14])
    nodes_of_3.run(_rounds, 6, 2, 64, 4, torch.bfloat16, [33, 34], torch.int64, True)
    nodes_of_3.run(_one_remote_node, 72)
    nodes_of_3.run(_fp8_rounds, [44, 45])


def _capturable(ctx):
    return ctx.backend == "cuda" and ctx.nccl_available


@pytest.mark.skipif(default_backend() != "cuda", reason="CUDA graphs need a GPU")
def test_graph_replay(pool):
    if not all(pool.run(_capturable)):
        pytest.skip("the rail is gloo through host copies here (ranks share a GPU): "
                    "not capturable")
    pool.run(_graph_replay, 3)


def _another_ones_dispatched(ctx):
    """combine of a Dispatched that another ExpertParallel's dispatch returned: a
    ValueError on every rank (each makes the same mistake), before anything is sent; both
    objects' next rounds are right."""
    E, k, H, M, dtype = 2 * ctx.world_size, 2, 32, 3, torch.bfloat16
    eps = [td.ExpertParallel(ctx, E, k, H, M, dtype=dtype) for _ in range(2)]
    try:
        ranks, a, b = _round_inputs(81, ctx.world_size, E, k, H, M, dtype)
        T, x, idx, w = ranks[ctx.rank]
        x, idx, w = x.to(ctx.device), idx.to(ctx.device), w.to(ctx.device)
        d = [ep.dispatch(x, idx) for ep in eps]
        ey = _run_experts(ctx, d[0], 2, a, b, dtype)
        kind, text, _ = attempt(lambda: eps[1].combine(ey, d[0], w))
        assert (kind, "another ExpertParallel" in text) == ("ValueError", True), (kind, text)
        for ep, dd in zip(eps, d):
            _check_combine(ep.combine(_run_experts(ctx, dd, 2, a, b, dtype), dd, w), T,
                           x.cpu(), idx.cpu(), w.cpu(), a, b, dtype)
        ctx.barrier()
    finally:
        for ep in eps:
            ep.close()


def test_combine_of_another_expert_parallels_dispatch_raises(pool):
    pool.run(_another_ones_dispatched)
