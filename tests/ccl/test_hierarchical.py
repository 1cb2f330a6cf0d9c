"""Collectives across nodes (trident/nodes/world.py, trident/nodes/hierarchical): 4 ranks as 2
nodes x 2 ranks and as 4 nodes x 1 (TRIDENT_NODE_SIZE in the ranks' environment), gloo
between the nodes -- on the CPU, on one GPU (the 4 ranks share it) and on 4 or more GPUs;
on 2 or 3 GPUs, 2 ranks as 2 nodes x 1, each on its own GPU, with NCCL between them. Every collective by both algorithms against plain torch on every
rank's input (odd sizes, empty tensors, a rank with no rows, sum/max/min, several
dtypes), the topology facts, bad inputs rejected as on one node, the fused ops' plain
fallback, MoE's argument checks across nodes; and, without ranks, the cost model and TRIDENT_NODE_SIZE's
checks."""
import os

import pytest
import torch

from trident.nodes import cost, topology
from trident.runtime.launch import RankPool, default_backend

from ..nodes import NODE_SIZES, WORLD, Layout, in_nodes_of, nodes_pool

from .refs import assert_equal, place, rank_inputs, reduce_ref

ALGS = ("hierarchical", "nccl")


def _by_local_world_size(ctx):
    """The layout torchrun gives: LOCAL_WORLD_SIZE=2 and no TRIDENT_NODE_SIZE."""
    return in_nodes_of(ctx, 2, _topology, env="LOCAL_WORLD_SIZE")


@pytest.fixture(params=NODE_SIZES, ids=lambda n: f"nodes_of_{n}")
def pool(request) -> Layout:
    return Layout(nodes_pool(WORLD, NODE_SIZES[0]), request.param)


# ---------------------------------------------------------------------------- in the ranks
def _topology(ctx):
    t = ctx.topology
    return dict(kind=type(ctx).__name__, rank=ctx.rank, world=ctx.world_size, node=t.node,
                local=t.local_rank, nodes=t.num_nodes, node_ranks=t.node_ranks(),
                rail=t.rail_ranks(), node_world=ctx.node.world_size, node_rank=ctx.node.rank,
                node_topology=ctx.node.topology.num_nodes, spans=ctx.spans_nodes)


def _collectives(ctx, seed):
    """Every collective by each algorithm on several cases; returns the failures."""
    w, me, dev = ctx.world_size, ctx.rank, ctx.device
    bad = []

    def check(got, expected, what):
        try:
            assert_equal(got, expected, what)
        except AssertionError as e:
            bad.append(str(e)[:300])

    for alg in ALGS if ctx.nccl_available else ALGS[:1]:    # no NCCL where GPUs are shared
        # all_reduce: sizes below, at and off multiples of the node size; heap and plain
        for i, (shape, dtype, op, heap) in enumerate([
                ((7,), torch.float32, "sum", False), ((1,), torch.float32, "max", False),
                ((3, 5), torch.float32, "min", True), ((64,), torch.bfloat16, "sum", True),
                ((0,), torch.float32, "sum", False), ((9,), torch.int32, "sum", False),
                ((5,), torch.int64, "max", True)]):       # integers: in their own type
            xs = rank_inputs(w, shape, dtype, seed + i)
            out = ctx.all_reduce(place(ctx, xs[me], heap), op=op, algorithm=alg)
            ref = reduce_ref(xs, op)
            if dtype == torch.bfloat16:        # two roundings across nodes: compare in fp32
                out, ref = out.float().cpu(), reduce_ref([x.float() for x in xs], op)
                if (out - ref).abs().max() > 0.05:
                    bad.append(f"{alg} all_reduce bf16: off by {(out - ref).abs().max()}")
                continue
            check(out, ref, f"{alg} all_reduce {shape} {op}")
        # all_gather: odd block, one element, empty blocks, a dtype without arithmetic
        for i, (shape, dtype) in enumerate([((3, 5), torch.float32), ((1,), torch.int64),
                                            ((2, 3), torch.bool), ((0, 4), torch.float32)]):
            xs = rank_inputs(w, shape, dtype, seed + 10 + i)
            out = torch.empty((w * shape[0], *shape[1:]), dtype=dtype, device=dev)
            ctx.all_gather(out, place(ctx, xs[me], False), algorithm=alg)
            check(out, torch.cat(xs), f"{alg} all_gather {shape} {dtype}")
        # reduce_scatter
        for i, (shape, op) in enumerate([((3,), "sum"), ((2, 5), "max"), ((1,), "min"),
                                         ((0, 2), "sum")]):
            xs = rank_inputs(w, (w * shape[0], *shape[1:]), torch.float32, seed + 20 + i)
            out = torch.empty(shape, device=dev)
            ctx.reduce_scatter(out, place(ctx, xs[me], False), op=op, algorithm=alg)
            check(out, reduce_ref(xs, op).chunk(w)[me] if shape[0] else out,
                  f"{alg} reduce_scatter {shape} {op}")
        # broadcast from every rank, odd size, integers
        for src in range(w):
            xs = rank_inputs(w, (13,), torch.int32, seed + 30 + src)
            t = place(ctx, xs[me], False)
            ctx.broadcast(t, src=src, algorithm=alg)
            check(t, xs[src], f"{alg} broadcast from {src}")
        # all_to_all: even splits (the two-stage path), uneven with empty sends/receives
        xs = rank_inputs(w, (2 * w, 3), torch.float32, seed + 40)
        out = torch.empty(2 * w, 3, device=dev)
        ctx.all_to_all(out, place(ctx, xs[me], False), algorithm=alg)
        check(out, torch.cat([x[2 * me:2 * me + 2] for x in xs]), f"{alg} all_to_all even")
        splits = [[0 if s == 0 or d == w - 1 else (s + 2 * d) % 3 + 1 for d in range(w)]
                  for s in range(w)]               # rank 0 sends nothing, w-1 gets nothing
        xs = [rank_inputs(w, (sum(splits[s]), 5), torch.bfloat16, seed + 41)[s]
              for s in range(w)]
        recv = [splits[s][me] for s in range(w)]
        out = torch.empty(sum(recv), 5, dtype=torch.bfloat16, device=dev)
        ctx.all_to_all(out, place(ctx, xs[me], False), out_splits=recv, in_splits=splits[me], algorithm=alg)
        ref = torch.cat([x[sum(splits[s][:me]):sum(splits[s][:me + 1])]
                         for s, x in enumerate(xs)])
        check(out, ref, f"{alg} all_to_all uneven")
    return bad


def _auto(ctx, seed):
    """"auto" at a small and a large size, two calls back to back (the max over ranks of
    the sum is the sum); the heap is the same on every rank afterwards (barrier checks)."""
    w, me = ctx.world_size, ctx.rank
    bad = []
    for n in (5, 1 << 12):
        xs = rank_inputs(w, (n,), torch.float32, seed + n)
        t = place(ctx, xs[me], False)
        ctx.all_reduce(t)
        ctx.all_reduce(t, op="max")
        if not torch.allclose(t.cpu(), reduce_ref(xs, "sum"), rtol=1e-5, atol=1e-5):
            bad.append(f"auto all_reduce at {n}")
    ctx.barrier()
    return bad


def _bad_inputs(ctx):
    """(what, exception type, message) of each bad call; every one must raise."""
    w = ctx.world_size
    calls = [
        ("out shape", lambda: ctx.all_gather(torch.empty(3), torch.empty(1))),
        ("rs shape", lambda: ctx.reduce_scatter(torch.empty(2), torch.empty(2 * w + 1))),
        ("int reduce", lambda: ctx.all_reduce(torch.zeros(4, dtype=torch.float64))),
        ("bad op", lambda: ctx.all_reduce(torch.zeros(4), op="prod")),
        ("src", lambda: ctx.broadcast(torch.zeros(4), src=w)),
        ("src bool", lambda: ctx.broadcast(torch.zeros(4), src=True)),
        ("algorithm", lambda: ctx.all_reduce(torch.zeros(4), algorithm="one_shot")),
        ("options", lambda: ctx.all_reduce(torch.zeros(4), block=64)),
        ("strided", lambda: ctx.all_reduce(torch.zeros(4, 2).t())),
        ("dtypes", lambda: ctx.all_gather(torch.empty(w), torch.empty(1, dtype=torch.int32))),
        ("a2a rows", lambda: ctx.all_to_all(torch.empty(w + 1), torch.empty(w + 1))),
        ("a2a splits", lambda: ctx.all_to_all(torch.empty(w), torch.empty(w),
                                              in_splits=[w] + [0] * (w - 2))),
        ("fused algorithm", lambda: ctx.matmul_all_reduce(
            torch.zeros(2, 4, dtype=torch.bfloat16), torch.zeros(3, 4, dtype=torch.bfloat16),
            algorithm="fused")),
        ("fused rows", lambda: ctx.matmul_reduce_scatter(
            torch.zeros(w + 1, 4, dtype=torch.bfloat16), torch.zeros(3, 4, dtype=torch.bfloat16))),
        ("fused dtype", lambda: ctx.all_gather_matmul(torch.zeros(2, 4), torch.zeros(3, 4))),
        ("moe", lambda: __import__("trident").ExpertParallel(ctx, w + 1, 1, 16, 4)),
    ]
    got = []
    for what, call in calls:
        try:
            with torch.device(ctx.device):     # the factories above make this rank's tensors
                call()
            got.append((what, None, ""))
        except (ValueError, TypeError) as e:
            got.append((what, type(e).__name__, str(e)))
    try:
        ctx.trace("never.json")
        got.append(("node-only", None, ""))
    except AttributeError as e:
        got.append(("node-only", "AttributeError", str(e)))
    ctx.barrier()                      # nothing was left half-done on any rank
    return got


def _fused_plain(ctx, seed):
    """The fused ops on a context across nodes: torch.matmul + torch.distributed."""
    w, me = ctx.world_size, ctx.rank

    def on(x):
        return x.to(ctx.device)

    a = rank_inputs(w, (3, 8), torch.bfloat16, seed)        # all_gather_matmul: rows
    wt = rank_inputs(1, (5, 8), torch.bfloat16, seed + 1)[0]
    bias = rank_inputs(1, (5,), torch.bfloat16, seed + 2)[0]
    out = ctx.all_gather_matmul(on(a[me]), on(wt), on(bias)).cpu()
    ref = (torch.cat(a).float() @ wt.float().t() + bias.float())
    errs = [float((out.float() - ref).abs().max())]
    parts = rank_inputs(w, (2 * w, 8), torch.bfloat16, seed + 3)   # row-parallel: K shards
    ws = rank_inputs(w, (5, 8), torch.bfloat16, seed + 4)
    full = sum(p.float() @ q.float().t() for p, q in zip(parts, ws)) + bias.float()
    out = ctx.matmul_all_reduce(on(parts[me]), on(ws[me]), on(bias)).cpu()
    errs.append(float((out.float() - full).abs().max()))
    out = ctx.matmul_reduce_scatter(on(parts[me]), on(ws[me]), on(bias)).cpu()
    errs.append(float((out.float() - full.chunk(w)[me]).abs().max()))
    return errs


# ---------------------------------------------------------------------------- tests
def test_topology(pool):
    got = pool.run(_topology)
    node_size = pool.node_size
    for r, g in enumerate(got):
        assert g["kind"] == "WorldContext" and g["spans"]
        assert (g["rank"], g["world"], g["nodes"]) == (r, WORLD, WORLD // node_size)
        assert (g["node"], g["local"]) == divmod(r, node_size)
        assert (g["node_rank"], g["node_world"], g["node_topology"]) == (r % node_size, node_size, 1)
        assert g["node_ranks"] == [g["node"] * node_size + i for i in range(node_size)]
        assert g["rail"] == [r % node_size + k * node_size for k in range(WORLD // node_size)]


def test_local_world_size():
    if (WORLD, NODE_SIZES[0]) != (4, 2):
        pytest.skip(f"written for 4 ranks in nodes of 2; this machine runs {WORLD} ranks")
    got = nodes_pool(WORLD, NODE_SIZES[0]).run(_by_local_world_size)
    assert [(g["node"], g["local"], g["rail"]) for g in got] == \
        [(0, 0, [0, 2]), (0, 1, [1, 3]), (1, 0, [0, 2]), (1, 1, [1, 3])]


def test_collectives(pool):
    for rank, bad in enumerate(pool.run(_collectives, 7)):
        assert not bad, f"rank {rank}: {bad}"


def test_auto(pool):
    for rank, bad in enumerate(pool.run(_auto, 3)):
        assert not bad, f"rank {rank}: {bad}"


def test_bad_inputs(pool):
    expected = {"int reduce": "TypeError", "dtypes": "TypeError", "fused dtype": "TypeError",
                "options": "TypeError", "node-only": "AttributeError"}
    for rank, got in enumerate(pool.run(_bad_inputs)):
        for what, kind, message in got:
            assert kind == expected.get(what, "ValueError"), f"rank {rank}: {what}: {kind} {message}"
            if what == "moe":      # the world's experts, across nodes (tests/moe has more)
                assert f"world size ({WORLD})" in message
            if what == "node-only":
                assert "ctx.node.trace" in message


def _graph_replay(ctx, seed):
    """all_reduce, all_gather and reduce_scatter (hierarchical: node kernels and the rail's
    NCCL calls) captured in one CUDA graph, replayed on new inputs written in place."""
    w, me, bad = ctx.world_size, ctx.rank, []
    t = torch.empty(4 * w + 1, device=ctx.device)
    inp, gathered = torch.empty(5, device=ctx.device), torch.empty(5 * w, device=ctx.device)
    big, part = torch.empty(3 * w, device=ctx.device), torch.empty(3, device=ctx.device)

    def calls():
        ctx.all_reduce(t, algorithm="hierarchical")
        ctx.all_gather(gathered, inp, algorithm="hierarchical")
        ctx.reduce_scatter(part, big, algorithm="hierarchical")

    def fill(i):
        xs = rank_inputs(w, t.shape, torch.float32, seed + i)
        gs = rank_inputs(w, inp.shape, torch.float32, seed + 100 + i)
        bs = rank_inputs(w, big.shape, torch.float32, seed + 200 + i)
        t.copy_(xs[me]), inp.copy_(gs[me]), big.copy_(bs[me])
        return reduce_ref(xs, "sum"), torch.cat(gs), reduce_ref(bs, "sum").chunk(w)[me]

    fill(0)
    calls()                                   # plans built before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    for i in range(1, 4):
        refs = fill(i)
        graph.replay()
        torch.cuda.synchronize()
        for got, ref, what in zip((t, gathered, part), refs, ("all_reduce", "all_gather",
                                                              "reduce_scatter")):
            if not torch.allclose(got.cpu(), ref, rtol=1e-5, atol=1e-5):
                bad.append(f"{what} replay {i}")
    ctx.barrier()
    return bad


def test_graph_replay(pool):
    if default_backend() != "cuda" or pool.node_size != NODE_SIZES[0] or WORLD > torch.cuda.device_count():
        pytest.skip("CUDA graphs with NCCL rails: GPUs with one rank each")
    for rank, bad in enumerate(pool.run(_graph_replay, 5)):
        assert not bad, f"rank {rank}: {bad}"


def _nccl(ctx):
    return ctx.nccl_available


def test_fused_ops_plain(pool):
    if not all(pool.run(_nccl)):
        pytest.skip("the plain path needs NCCL over the world: ranks share a GPU here "
                    "(test_bad_inputs checks the refusal)")
    for rank, errs in enumerate(pool.run(_fused_plain, 11)):
        # bf16 outputs of sums over 8*4 products of |x| ~ 1: a few bf16 steps
        assert max(errs) < 0.15, f"rank {rank}: {errs}"


# ---------------------------------------------------------------------------- no ranks
def test_node_size_env(monkeypatch):
    monkeypatch.delenv(topology.NODE_SIZE_ENV, raising=False)
    assert topology.node_size_from_env(4) is None
    monkeypatch.setenv(topology.NODE_SIZE_ENV, "2")
    assert topology.node_size_from_env(6) == 2
    for value, world in (("3", 4), ("0", 4), ("two", 4), ("-2", 4)):
        monkeypatch.setenv(topology.NODE_SIZE_ENV, value)
        with pytest.raises(ValueError, match="TRIDENT_NODE_SIZE"):
            topology.node_size_from_env(world)
    text = topology.layout(6, 3, "TRIDENT_NODE_SIZE=3")
    assert "node 1: ranks [3, 4, 5]" in text and "rail 2: ranks [2, 5]" in text


def test_nodes_from_hosts():
    assert topology._node_size(["a", "a", "b", "b"], "host names") == 2
    for bad in (["a", "b", "a", "b"], ["a", "a", "a", "b"]):
        with pytest.raises(ValueError, match="consecutive"):
            topology._node_size(bad, "host names")


def test_cost_model(monkeypatch):
    monkeypatch.delenv(cost.INTER_GBPS_ENV, raising=False)
    monkeypatch.delenv(cost.INTER_US_ENV, raising=False)
    # large reductions: L times fewer network bytes win; 8 nodes of 8 GPUs
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        t = cost.predict(op, 1 << 28, 8, 8)
        assert t["hierarchical"] < t["nccl"] / 3, (op, t)
        assert cost.choose(op, 1 << 28, 8, 8) == "hierarchical"
    # one rank per node: the node steps only add latency
    assert cost.choose("all_reduce", 1 << 10, 4, 1) == "nccl"
    # all_to_all moves the same network bytes: the flat one wins when messages are large
    # and the network fast, the two-stage one when hops dominate
    assert cost.choose("all_to_all", 1 << 30, 2, 8) == "nccl"
    assert cost.choose("all_to_all", 1 << 12, 8, 8) == "hierarchical"
    # the parameters move the crossover: a slow network favours fewer network bytes
    monkeypatch.setenv(cost.INTER_GBPS_ENV, "1")
    slow = cost.predict("all_reduce", 1 << 20, 2, 2)
    monkeypatch.setenv(cost.INTER_GBPS_ENV, "1000")
    fast = cost.predict("all_reduce", 1 << 20, 2, 2)
    assert slow["nccl"] > fast["nccl"] and slow["hierarchical"] > fast["hierarchical"]
    monkeypatch.setenv(cost.INTER_US_ENV, "0")
    with pytest.raises(ValueError, match=cost.INTER_US_ENV):
        cost.internode()


def test_selector_across_nodes():
    for op in ("all_reduce", "all_to_all", "broadcast"):
        for nbytes in (1 << 10, 1 << 30):
            assert cost.select(op, nbytes, 4, 1) == cost.choose(op, nbytes, 4, 1)
            # no NCCL (GPU ranks sharing a GPU): never the flat torch.distributed path
            assert cost.select(op, nbytes, 4, 1, nccl=False) == "hierarchical"


def test_info_prints_layout(monkeypatch, capsys):
    from trident.runtime import _env
    from trident.tools.info import _nodes_info
    if not _env.INTERPRET:
        pytest.skip("the default world of `trident info` on GPUs depends on the GPUs")
    monkeypatch.setenv(topology.NODE_SIZE_ENV, "2")
    _nodes_info()
    text = capsys.readouterr().out
    assert "2 node(s) of 2 rank(s)" in text and "rail 1: ranks [1, 3]" in text
    assert cost.INTER_GBPS_ENV in text
    monkeypatch.setenv(topology.NODE_SIZE_ENV, "3")
    _nodes_info()
    assert "does not split 4 ranks" in capsys.readouterr().out


# ---------------------------------------------------------------------------- 2 nodes x 3
@pytest.fixture(scope="module")
def nodes_of_3():
    """6 ranks as 2 nodes x 3: odd node sizes (a shard per local rank that is not a power
    of two). On the CPU, and on GPUs only where each rank has its own GPU."""
    if default_backend() == "cuda" and torch.cuda.device_count() < 6:
        pytest.skip("2 nodes x 3 on GPUs needs 6 GPUs (the CPU emulation runs it)")
    return nodes_pool(6, 3)


def test_two_nodes_of_three(nodes_of_3):
    for r, g in enumerate(nodes_of_3.run(_topology)):
        assert (g["world"], g["nodes"], g["node"], g["local"]) == (6, 2, r // 3, r % 3)
        assert g["rail"] == [r % 3, r % 3 + 3]
    for rank, bad in enumerate(nodes_of_3.run(_collectives, 17)):
        assert not bad, f"rank {rank}: {bad}"
    for rank, bad in enumerate(nodes_of_3.run(_auto, 5)):
        assert not bad, f"rank {rank}: {bad}"
