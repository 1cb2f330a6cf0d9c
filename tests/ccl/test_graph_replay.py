"""Every collective, with every algorithm of the registry, captured once in a CUDA graph
and replayed many times with new data (GPU only: the CPU emulation has no graphs). Epochs
live on the device, so a replay must see fresh flags without any host work in between."""
import pytest
import torch

from trident.ccl import registry

from .. import algorithms
from .refs import assert_equal, captured, rank_inputs, reduce_ref


def rounds() -> list[dict]:
    """{op: algorithm} of each capture: round i takes the i-th algorithm of every op's in
    the registry (tests/algorithms.py; an op with fewer starts over), so that every
    algorithm is captured and replayed, flag and Lamport kernels side by side."""
    names = {op: algorithms.kernels(op) for op in registry.OPS}
    return [{op: ns[i % len(ns)] for op, ns in names.items()}
            for i in range(max(map(len, names.values())))]


def _capture_and_replay(ctx, algs, replays):
    w, n = ctx.world_size, 4096 + 17
    x = torch.empty(n, dtype=torch.bfloat16, device=ctx.device)
    ag_out = torch.empty(w * n, dtype=torch.bfloat16, device=ctx.device)
    rs_in = torch.empty(w * n, dtype=torch.float32, device=ctx.device)
    rs_out = torch.empty(n, dtype=torch.float32, device=ctx.device)
    a2a_in = torch.empty(w * 8, 3, dtype=torch.float16, device=ctx.device)
    a2a_out = torch.empty_like(a2a_in)
    bc = torch.empty(n, dtype=torch.float32, device=ctx.device)
    ar = torch.empty(n, dtype=torch.float32, device=ctx.device)

    def ops():
        ar.copy_(x.float())
        ctx.all_reduce(ar, algorithm=algs["all_reduce"])
        ctx.all_gather(ag_out, x, algorithm=algs["all_gather"])
        ctx.reduce_scatter(rs_out, rs_in, algorithm=algs["reduce_scatter"])
        ctx.all_to_all(a2a_out, a2a_in, algorithm=algs["all_to_all"])
        ctx.broadcast(bc, src=w - 1, algorithm=algs["broadcast"])

    graph = captured(ctx, ops)             # after a warm-up: workspaces made outside capture
    for i in range(replays):
        xs = rank_inputs(w, (n,), torch.bfloat16, seed=1000 + i)
        rss = rank_inputs(w, (w * n,), torch.float32, seed=2000 + i)
        a2as = rank_inputs(w, (w * 8, 3), torch.float16, seed=3000 + i)
        bcs = rank_inputs(w, (n,), torch.float32, seed=4000 + i)
        x.copy_(xs[ctx.rank])
        rs_in.copy_(rss[ctx.rank])
        a2a_in.copy_(a2as[ctx.rank])
        bc.copy_(bcs[ctx.rank])
        graph.replay()
        ctx.sync()
        assert_equal(ar, reduce_ref([t.float() for t in xs], "sum"), f"all_reduce replay {i}")
        assert_equal(ag_out, torch.cat(xs), f"all_gather replay {i}")
        assert_equal(rs_out, reduce_ref(rss, "sum").chunk(w)[ctx.rank], f"reduce_scatter {i}")
        assert_equal(a2a_out, torch.cat([t.chunk(w)[ctx.rank] for t in a2as]), f"all_to_all {i}")
        assert_equal(bc, bcs[w - 1], f"broadcast replay {i}")
        ctx.barrier()     # the next round's inputs are written by the host


def _capture_and_replay_lamport(ctx, replays):
    """broadcast's and all_to_all's lamport (uneven splits, a zero-row pair), captured
    once beside all_reduce's and replayed: the round counter lives on the device, so every
    replay finds its buffers and flags of the round it is in."""
    w, r, n = ctx.world_size, ctx.rank, 1000 + 3
    S = [[(s + d) % 3 for d in range(w)] for s in range(w)]         # S[s][d] rows of 5
    bc = torch.empty(n, dtype=torch.bfloat16, device=ctx.device)
    a2a_in = torch.empty(sum(S[r]), 5, dtype=torch.int8, device=ctx.device)
    a2a_out = torch.empty(sum(S[s][r] for s in range(w)), 5, dtype=torch.int8,
                          device=ctx.device)
    ar = torch.empty(n, dtype=torch.float32, device=ctx.device)

    def ops():
        ctx.broadcast(bc, src=w - 1, algorithm="lamport")
        ctx.all_to_all(a2a_out, a2a_in, out_splits=[S[s][r] for s in range(w)],
                       in_splits=S[r], algorithm="lamport")
        ctx.all_reduce(ar, algorithm="lamport")

    ops()                                  # warm-up: workspaces are created outside capture
    ctx.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops()
    ctx.barrier()
    for i in range(replays):
        bcs = rank_inputs(w, (n,), torch.bfloat16, seed=5000 + i)
        a2as = [x[:sum(S[s])] for s, x in
                enumerate(rank_inputs(w, (2 * w, 5), torch.int8, seed=6000 + i))]
        ars = rank_inputs(w, (n,), torch.float32, seed=7000 + i)
        bc.copy_(bcs[r])
        a2a_in.copy_(a2as[r])
        ar.copy_(ars[r])
        graph.replay()
        ctx.sync()
        assert torch.equal(bc.cpu(), bcs[w - 1]), f"broadcast lamport replay {i}"
        assert_equal(a2a_out, torch.cat([a2as[s].split(S[s])[r] for s in range(w)]),
                     f"all_to_all lamport replay {i}")
        assert_equal(ar, reduce_ref(ars, "sum"), f"all_reduce lamport replay {i}")
        ctx.barrier()


def test_graph_capture_and_replay_lamport(pool):
    if pool.backend != "cuda":
        pytest.skip("CUDA graphs need GPUs")
    pool.run(_capture_and_replay_lamport, 20)


@pytest.mark.parametrize("algs", rounds(), ids=lambda algs: "-".join(algs.values()))
def test_graph_capture_and_replay(pool, algs):
    if pool.backend != "cuda":
        pytest.skip("CUDA graphs need GPUs")
    pool.run(_capture_and_replay, algs, 20)
