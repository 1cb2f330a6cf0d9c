"""Faults across nodes: 4 CPU ranks as 2 nodes x 2 (TRIDENT_NODE_SIZE=2), gloo between
the nodes. A rank of the other node dies, raises, or a whole node skips a call: every
case must end within the context's host timeout plus 10 s with an error that names what
happened, and leave no rank process behind (as tests/faults/test_faults.py on one node)."""
import os
import signal
import time

import pytest
import torch

from trident.runtime.errors import CommTimeout, Failure, GroupUnusable, InterNodeError, PeerFailed

from ..nodes import pool_in_nodes

from .procs import alive

TIMEOUT = 5.0                 # device waits; host collectives and the rails: + 5 s
WORLD, NODE = 4, 2


def _fault(fn):
    """Run fn on 4 fresh ranks in nodes of 2; return the exception it raised and its text
    (with notes), after checking the time it took and that no rank was left over."""
    pool = pool_in_nodes(WORLD, NODE, backend="cpu", heap_size=4 << 20, timeout=TIMEOUT,
                         run_timeout=120)
    pids = pool.pids
    t0 = time.monotonic()
    try:
        with pytest.raises(Exception) as info:
            pool.run(fn)
        took = time.monotonic() - t0
    finally:
        pool.close(force=True)
    assert took < TIMEOUT + 5 + 10, f"the fault took {took:.1f} s to report"
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids), "a rank process was left over"
    exc = info.value
    return exc, "\n".join([str(exc), *getattr(exc, "__notes__", [])])


# ---------------------------------------------------------------- in the ranks
def _node_skips_a_call(ctx):
    assert ctx.spans_nodes and ctx.topology.num_nodes == 2
    t = torch.ones(64)
    ctx.all_reduce(t, algorithm="hierarchical")       # first call: made on every rank
    ctx.set_timeout(1.0)       # device waits only: the rails keep the limit of their making
    if ctx.topology.node == 0:
        ctx.all_reduce(t, algorithm="hierarchical")   # node 1 goes on to the barrier
    ctx.barrier()


def _rank_of_other_node_raises(ctx):
    t = torch.ones(64)
    if ctx.rank == 3:
        raise ValueError("rank 3 gave up before all_gather")
    out = torch.empty(WORLD * 64)
    ctx.all_gather(out, t, algorithm="hierarchical")
    ctx.barrier()


def _rank_of_other_node_dies(ctx):
    t = torch.ones(64)
    ctx.all_reduce(t, algorithm="hierarchical")
    if ctx.rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.all_reduce(t, algorithm="hierarchical")
    ctx.barrier()


def _rail_reused_after_failure(ctx):
    """Node 1 skips an all_reduce: node 0's rail step fails, and the later calls over the
    same rail must fail without a collective on it. Returns, on node 0, the seconds of the
    all_gather's refusal and the messages of both refusals."""
    t, out = torch.ones(64), torch.empty(WORLD * 64)
    ctx.all_reduce(t, algorithm="hierarchical")       # made on every rank
    ctx.all_gather(out, t, algorithm="hierarchical")
    if ctx.topology.node == 1:
        return None
    with pytest.raises(InterNodeError):
        ctx.all_reduce(t, algorithm="hierarchical")
    # not timed: all_reduce's rail step comes after its node step, a reduce_scatter that
    # waits for the node's other rank and runs its kernel in the Triton interpreter
    # (0.05-0.7 s on the 2-core machine, 2.5 s and 4.3 s under heavier load; it was the
    # 1.07 s that once failed a bound of 1 s on this call)
    with pytest.raises(GroupUnusable) as again:
        ctx.all_reduce(t, algorithm="hierarchical")
    # all_gather's rail step is its first: its time is the refusal alone (under 2 ms here)
    t0 = time.monotonic()
    with pytest.raises(GroupUnusable) as first:
        ctx.all_gather(out, t, algorithm="hierarchical")
    return time.monotonic() - t0, str(again.value), str(first.value)


# ---------------------------------------------------------------- the cases
def test_node_skips_a_call():
    exc, text = _fault(_node_skips_a_call)
    assert isinstance(exc, CommTimeout), text
    # node 0 waits in all_reduce's rail step, node 1 in the barrier's: each names its own,
    # and the limit the rail group was made with (not the later set_timeout's)
    assert "between nodes" in text and ("all_reduce" in text or "ctx.barrier()" in text), text
    assert f"within {TIMEOUT + 5:g} s" in text, text


def test_rank_of_other_node_raises():
    exc, text = _fault(_rank_of_other_node_raises)
    assert isinstance(exc, ValueError), text
    assert "rank 3 gave up before all_gather" in text and "raised on rank 3" in text, text


def test_rank_of_other_node_dies():
    exc, text = _fault(_rank_of_other_node_dies)
    assert "rank 3 process died (killed by SIGKILL)" in text, text


def test_inter_node_error_pickles():
    import pickle
    e = InterNodeError("all_reduce", 1, [1, 3], 10.0, "Timed out")
    again = pickle.loads(pickle.dumps(e))
    assert str(again) == str(e) and again.ranks == [1, 3] and isinstance(again, CommTimeout)
    u = GroupUnusable("all_reduce", 2, "ctx.barrier()")
    again = pickle.loads(pickle.dumps(u))
    assert str(again) == str(u) and again.earlier == "ctx.barrier()" and again.peer is None


def test_peer_failed_renumbers_its_ranks_on_data():
    """A node's PeerFailed in world ranks (nodes/expert_parallel.py _agree): every rank it
    names, its cause's too, renumbered from the fields, whatever the cause's message says
    (a message that names a rank itself is kept as it is); it pickles with its cause."""
    import pickle
    cause = Failure.of(ValueError("num_experts=9 on rank 1: not a multiple"), 1, "ExpertParallel")
    e = PeerFailed("ExpertParallel (its host barrier)", 0, 1, cause)
    assert "(ExpertParallel, which raised ValueError on rank 1: num_experts=9 on rank 1: " \
        in str(e), str(e)
    world = e.renumbered(lambda r: 2 + r, "ExpertParallel")
    assert (world.rank, world.peer, world.cause.rank, world.op) == (2, 3, 3, "ExpertParallel")
    assert str(world).startswith(
        "rank 2: ExpertParallel stopped: rank 3, which it waited for, failed (ExpertParallel, "
        "which raised ValueError on rank 3: num_experts=9 on rank 1: not a multiple)"), str(world)
    assert (e.rank, e.peer, e.cause.rank) == (0, 1, 1)          # the node's own is unchanged
    again = pickle.loads(pickle.dumps(world))
    assert str(again) == str(world) and again.cause == world.cause
    text = PeerFailed("all_reduce", 0, 1, "a cause as text, rank 1").renumbered(lambda r: r + 4)
    assert (text.rank, text.peer, text.cause) == (4, 5, "a cause as text, rank 1")
    assert str(Failure("CallMismatch", 2, "rank 2: x")) == "CallMismatch on rank 2: rank 2: x"


def test_a_failed_rail_is_not_used_again():
    pool = pool_in_nodes(WORLD, NODE, backend="cpu", heap_size=4 << 20, timeout=TIMEOUT,
                         run_timeout=120)
    try:
        results = pool.run(_rail_reused_after_failure)
    finally:
        pool.close(force=True)
    for took, again, first in results[:NODE]:
        assert took < 1.0, took      # at once: a retried rail step would wait TIMEOUT + 5 s
        assert "all_reduce (its step between nodes) was not attempted" in again, again
        assert "all_gather (its step between nodes) was not attempted" in first, first
    assert results[NODE:] == [None] * NODE
