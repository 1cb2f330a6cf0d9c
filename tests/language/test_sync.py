"""signal/wait, the device barrier, and bounded waits that become CommTimeout."""
import re
import time

import pytest
import torch
import torch.distributed as dist
import triton
import triton.language as tl

import trident as td
import trident.language as tdl
from trident.runtime.errors import CallMismatch, PeerFailed


@triton.jit
def _ping_pong_kernel(flags, data, log, ctrl, rank, heap_bases, rounds):
    """Ranks 0 and 1 take turns: each round, write a value into the peer, then signal it.
    The receiver checks the value arrived with the flag and records it."""
    peer = 1 - rank
    for i in range(rounds):
        if (i % 2) == rank:
            tdl.store(data, i * 7 + 3, rank, peer, heap_bases)
            tdl.signal(flags, i + 1, rank, peer, heap_bases)
        else:
            tdl.wait(flags, i + 1, ctrl, rank, peer, 12)
            tl.store(log + i, tl.load(data, volatile=True))


def _ping_pong(ctx, rounds):
    flags = ctx.zeros(1, dtype=torch.int32)
    data = ctx.zeros(1, dtype=torch.int32)
    log = ctx.full(rounds, -1, dtype=torch.int32)
    ctx.barrier()
    if ctx.rank < 2:
        _ping_pong_kernel[(1,)](flags, data, log, ctx.ctrl, ctx.rank, ctx.heap_bases, rounds)
    ctx.barrier()
    if ctx.rank < 2:
        mine = torch.arange(rounds)[torch.arange(rounds) % 2 != ctx.rank]
        got = log.cpu()[mine]
        assert torch.equal(got, (mine * 7 + 3).to(torch.int32)), got


def test_ping_pong_1000_rounds(pool):
    if pool.world_size == 1:
        pytest.skip("a ping-pong needs two ranks")
    pool.run(_ping_pong, 1000)


@triton.jit
def _barrier_rounds_kernel(slots, errors, ctrl, rank, world_size, heap_bases, rounds):
    """Each round every rank writes the round number into its slot on every peer, meets the
    others at the barrier, checks that every slot holds this round, and meets them again."""
    bad = 0
    for i in range(rounds):
        for peer in range(world_size):
            tdl.store(slots + rank, i + 1, rank, peer, heap_bases)
        tdl.barrier(ctrl, rank, world_size, heap_bases)
        for peer in range(world_size):
            bad += (tl.load(slots + peer, volatile=True) != i + 1).to(tl.int32)
        tdl.barrier(ctrl, rank, world_size, heap_bases)
    tl.store(errors, bad)


def _barrier_rounds(ctx, rounds):
    slots = ctx.zeros(ctx.world_size, dtype=torch.int32)
    errors = ctx.full(1, -1, dtype=torch.int32)
    ctx.barrier()
    _barrier_rounds_kernel[(1,)](slots, errors, ctx.ctrl, ctx.rank, ctx.world_size,
                                 ctx.heap_bases, rounds)
    for _ in range(10):          # the host-launched barrier kernel, back to back
        ctx.device_barrier()
    ctx.barrier()
    assert errors.item() == 0, f"{errors.item()} slots seen before their round was written"


def test_device_barrier_repeated_without_reset(pool):
    pool.run(_barrier_rounds, 50)


@triton.jit
def _wait_for_rank1_kernel(flag, ok, ctrl, rank, heap_bases):
    tl.store(ok, tdl.wait(flag, 1, ctrl, rank, 1, 12).to(tl.int32))


def _silent_peer(ctx):
    flag = ctx.zeros(1, dtype=torch.int32)
    ok = ctx.full(1, -1, dtype=torch.int32)
    ctx.set_timeout(0.5)
    ctx.barrier()
    start = time.monotonic()
    try:
        if ctx.rank != 1:      # rank 1 never signals
            _wait_for_rank1_kernel[(1,)](flag, ok, ctx.ctrl, ctx.rank, ctx.heap_bases)
            with pytest.raises(td.CommTimeout) as e:
                ctx.sync()
            assert e.value.rank == ctx.rank and e.value.peer == 1 and e.value.op == "test"
            assert ok.item() == 0
        else:
            # silent, and not yet in a host call: a peer's wait that saw it in the barrier
            # below would raise CallMismatch naming both calls instead (3a9f77a;
            # tests/faults/test_mismatched_host_calls.py)
            time.sleep(3 * ctx.timeout_s)
        # the failure is sticky until reset (README "Reliability"): the barrier raises it
        # on every rank, then a reset makes the context usable again
        with pytest.raises(td.CommTimeout, match="timed out .* from rank 1"):
            ctx.barrier()
        ctx.reset()
        ctx.barrier()
    finally:
        ctx.set_timeout(60.0)
    return time.monotonic() - start


def test_silent_peer_gives_comm_timeout(pool):
    elapsed = pool.run(_silent_peer)
    assert max(elapsed) < 20, elapsed


@triton.jit
def _mismatch_then_wait_kernel(flag, ok, ctrl, rank, peer):
    """A launch whose first exchange found another call (CallMismatch), then waits again
    (a later phase) for a signal that has not come: that wait returns at once, since the
    error word is set, and records again (a timeout)."""
    tdl.record_error(ctrl, rank, peer, 12, tdl.KIND_MISMATCH)
    tl.store(ok, tdl.wait(flag, 1, ctrl, rank, peer, 12).to(tl.int32))


def _first_error_is_raised(ctx):
    flag = ctx.zeros(1, dtype=torch.int32)
    ok = ctx.full(1, -1, dtype=torch.int32)
    peer = (ctx.rank + 1) % ctx.world_size
    start = time.monotonic()
    _mismatch_then_wait_kernel[(1,)](flag, ok, ctx.ctrl, ctx.rank, peer)
    # the next call raises what the host word holds (no sync; on GPUs, pinned memory):
    # the first error, as the control block's word does -- not the wait recorded after it
    with pytest.raises(CallMismatch, match=f"rank {ctx.rank}: test: rank {peer} made a "):
        ctx.all_reduce(torch.ones(8, device=ctx.device))
    with pytest.raises(CallMismatch):
        ctx.sync()
    assert ok.item() == 0 and time.monotonic() - start < 5
    ctx.reset()


def test_the_first_error_is_raised_not_the_last(pool):
    pool.run(_first_error_is_raised)


@triton.jit
def _mismatch_kernel(ctrl, rank, peer):
    tdl.record_error(ctrl, rank, peer, 12, tdl.KIND_MISMATCH)


@triton.jit
def _wait_for_kernel(flag, ok, ctrl, rank, peer):
    tl.store(ok, tdl.wait(flag, 1, ctrl, rank, peer, 12).to(tl.int32))


def _peer_failed_before_it_published(ctx):
    """Rank 0 finds a different call (its error word); rank 1's wait for it then stops
    (PeerFailed) and rank 1 raises before rank 0's host has raised, so before rank 0
    published its message: as on GPUs, where both raise at one barrier and the peer's
    message is read before the peer has written it. The cause is still quoted."""
    flag = ctx.zeros(1, dtype=torch.int32)
    ok = ctx.full(1, -1, dtype=torch.int32)
    ctx.sync()
    if ctx.rank == 0:
        _mismatch_kernel[(1,)](ctx.ctrl, 0, 1)
    dist.barrier(group=ctx.group)                  # rank 0's error word is set
    raised = None
    if ctx.rank == 1:
        _wait_for_kernel[(1,)](flag, ok, ctx.ctrl, 1, 0)
        try:
            ctx.all_reduce(torch.ones(8, device=ctx.device))
        except PeerFailed as exc:
            raised = str(exc)
        assert ok.item() == 0
    dist.barrier(group=ctx.group)                  # rank 1 raised: now rank 0 does
    if ctx.rank == 0:
        with pytest.raises(CallMismatch):
            ctx.all_reduce(torch.ones(8, device=ctx.device))
    ctx.reset()
    if ctx.rank == 1:
        assert raised is not None and re.search(
            "stopped: rank 0, .*CallMismatch on rank 0: rank 0: test: rank 1 made a "
            "different call", raised), raised


def test_a_peer_failed_quotes_a_cause_not_yet_published(pool):
    pool.run(_peer_failed_before_it_published)


def _timeout_at_barrier(ctx):
    flag = ctx.zeros(1, dtype=torch.int32)
    ok = ctx.zeros(1, dtype=torch.int32)
    ctx.set_timeout(0.3)
    try:
        if ctx.rank == 0:
            _wait_for_rank1_kernel[(1,)](flag, ok, ctx.ctrl, ctx.rank, ctx.heap_bases)
        else:
            time.sleep(1.0)    # silent past rank 0's timeout, not in a host call (see above)
        with pytest.raises(td.CommTimeout, match="rank 0: test timed out .* from rank 1"):
            ctx.barrier()      # every rank learns of rank 0's timeout
        with pytest.raises(td.CommTimeout, match="rank 0: test timed out .* from rank 1"):
            ctx.barrier()      # and again at the next call, until a reset
        ctx.reset()
        ctx.barrier()
    finally:
        ctx.set_timeout(60.0)


def test_timeout_is_raised_on_every_rank_at_barrier(pool):
    pool.run(_timeout_at_barrier)


def _debug_mode(ctx):
    with td.init(heap_size=1 << 20, group=ctx.group, timeout=0.3, debug=True) as dbg:
        for _ in range(3):
            dbg.device_barrier()      # checked after each op; all ranks take part: no error
        assert dbg.ctrl[0].item() == 0


def test_debug_mode_checks_after_each_op(pool):
    pool.run(_debug_mode)


def _timestamps(ctx):
    out = ctx.zeros(2, dtype=torch.int64)
    _timestamp_kernel[(1,)](out)
    ctx.sync()
    t0, t1 = out.tolist()
    assert 0 < t0 <= t1


@triton.jit
def _timestamp_kernel(out):
    tl.store(out, tdl.timestamp())
    tl.store(out + 1, tdl.timestamp())


def test_timestamp_is_monotonic(pool):
    pool.run(_timestamps)
