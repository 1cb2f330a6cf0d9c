"""Faults while ranks run: one rank raises, dies, or skips a call (debug mode on and off).

Every case must end within the context's timeout plus 10 s, with a message that names the
rank and the op, and leave no rank process and no /dev/shm file of its job behind. Each
case starts its own small pool (the process group does not survive a host-side timeout).
The launcher's own faults (SIGINT, SIGTERM, SIGKILL) are in test_launcher_signals.py.
"""
import glob
import os
import signal
import time

import pytest
import torch

import trident as td
from trident.runtime.errors import CallMismatch, HostTimeout
from trident.runtime.errors import GroupUnusable
from trident.runtime.launch import RankPool

from .procs import alive

TIMEOUT = 5.0          # the context's timeout in these cases (device waits, host collectives)


def _fault(fn, *args, debug: bool = False):
    """Run fn on 2 fresh ranks; return the exception it raised (with its notes joined into
    its text) after checking the time it took and that nothing is left behind."""
    pool = RankPool(2, backend="cpu", heap_size=4 << 20, timeout=TIMEOUT, run_timeout=120)
    pids, job = pool.pids, pool.job
    t0 = time.monotonic()
    try:
        with pytest.raises(Exception) as info:
            pool.run(fn, debug, *args)
        took = time.monotonic() - t0
    finally:
        pool.close(force=True)
    assert took < TIMEOUT + 10, f"the fault took {took:.1f} s to report"
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids), "a rank process was left over"
    assert not glob.glob(f"/dev/shm/trident-{job}-*"), "a shared-memory file was left over"
    exc = info.value
    return exc, "\n".join([str(exc), *getattr(exc, "__notes__", [])])


# ---------------------------------------------------------------- functions the ranks run
def _one_rank_raises(ctx, debug):
    ctx.debug = debug
    t = ctx.ones(256)
    if ctx.rank == 1:
        raise ValueError("rank 1 gave up before all_reduce")
    ctx.all_reduce(t)
    ctx.barrier()


def _one_rank_is_killed(ctx, debug):
    ctx.debug = debug
    t = ctx.ones(256)
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.all_reduce(t)
    ctx.barrier()


def _one_rank_skips(ctx, debug):
    ctx.debug = debug
    t = ctx.ones(256)
    ctx.all_reduce(t)              # first call: plan and workspaces made on both ranks
    if ctx.rank == 0:
        ctx.all_reduce(t)
    ctx.barrier()


def _one_rank_skips_barrier(ctx, debug):
    ctx.debug = debug
    if ctx.rank == 0:
        ctx.barrier()


def _one_rank_skips_first_call(ctx, debug):
    """Rank 1 skips the first call of a fused op: rank 0 creates its workspace meanwhile."""
    ctx.debug = debug
    a = torch.randn(8, 32, dtype=torch.bfloat16)
    w = torch.randn(16, 32, dtype=torch.bfloat16)
    if ctx.rank == 0:
        ctx.all_gather_matmul(a, w, algorithm="fused")
    ctx.barrier()


def _one_rank_fails_then_cleans_up(ctx, debug):
    """Rank 1 fails a check; its `finally` meets rank 0 in a barrier after rank 0's
    all_reduce has waited for it in vain."""
    ctx.debug = debug
    t = ctx.ones(256)
    ctx.all_reduce(t)              # first call: plan and workspaces made on both ranks
    try:
        if ctx.rank == 1:
            raise AssertionError("rank 1's check failed")
        ctx.all_reduce(t)
    finally:
        ctx.barrier()


def _reuse_after_host_timeout(ctx):
    """Rank 1 skips a barrier; rank 0's times out, and its next host collective must fail
    at once. Returns (seconds that took, its message) on rank 0."""
    if ctx.rank == 1:
        return None
    with pytest.raises(HostTimeout):
        ctx.barrier()
    t0 = time.monotonic()
    with pytest.raises(GroupUnusable) as info:
        ctx.barrier()
    return time.monotonic() - t0, str(info.value)


def _sizes_in_different_classes(ctx, debug):
    """Staging buffers of different size classes on the two ranks (debug off)."""
    ctx.debug = debug
    ctx.all_reduce(torch.ones(64), algorithm="one_shot")      # the shared state exists
    n = 64 if ctx.rank == 0 else 40000
    ctx.all_reduce(torch.ones(n), algorithm="one_shot")
    ctx.barrier()


# ---------------------------------------------------------------- the cases
@pytest.mark.parametrize("debug", [False, True], ids=["debug_off", "debug_on"])
def test_one_rank_raises(debug):
    exc, text = _fault(_one_rank_raises, debug=debug)
    assert isinstance(exc, ValueError), text
    assert "rank 1 gave up before all_reduce" in text and "raised on rank 1" in text


def test_one_rank_is_killed():
    exc, text = _fault(_one_rank_is_killed)
    assert "rank 1 process died (killed by SIGKILL)" in text, text
    assert "rank 0" in text and "all_reduce (a call that creates the workspace" in text, text


def test_a_failure_before_cleanup_is_named():
    """The barrier in rank 1's cleanup raises rank 0's timeout on both ranks; the report
    leads with rank 1's, which names the error it was raised while handling."""
    exc, text = _fault(_one_rank_fails_then_cleans_up)
    assert isinstance(exc, td.CommTimeout), text
    assert "raised on rank 1" in text, text
    assert "this rank first raised AssertionError: rank 1's check failed" in text, text
    [rank0] = [line for line in text.splitlines() if line.startswith("rank 0 failed too")]
    assert "while handling" not in rank0, text       # rank 0 had nothing else to handle


def test_one_rank_skips_a_collective():
    exc, text = _fault(_one_rank_skips)
    assert isinstance(exc, td.CommTimeout), text
    assert "all_reduce" in text and "rank 0" in text, text


def test_one_rank_skips_a_collective_debug():
    """Debug mode names the mismatch at once instead of aborting the process."""
    exc, text = _fault(_one_rank_skips, debug=True)
    assert isinstance(exc, CallMismatch), text
    assert "rank 0 called all_reduce" in text and "rank 1 called ctx.barrier()" in text, text


@pytest.mark.parametrize("debug", [False, True], ids=["debug_off", "debug_on"])
def test_one_rank_skips_barrier(debug):
    exc, text = _fault(_one_rank_skips_barrier, debug=debug)
    assert isinstance(exc, HostTimeout), text
    assert "rank 0: ctx.barrier()" in text and f"within {TIMEOUT + 5:g} s" in text, text
    # the rank that never came is named (its key is missing from the exchange)
    assert "rank 1 did not join it" in text and exc.missing == (1,), text


def test_one_rank_skips_the_first_call_of_an_op():
    exc, text = _fault(_one_rank_skips_first_call)
    assert isinstance(exc, CallMismatch), text
    assert "rank 0 called all_gather_matmul (a call that creates the workspace" in text, text
    assert "rank 1 called ctx.barrier()" in text, text


def test_sizes_in_different_scratch_classes():
    """Only rank 1 needs a larger scratch buffer (a new workspace) on its call."""
    exc, text = _fault(_sizes_in_different_classes)
    # rank 0's kernel times out waiting (device timeout) and reaches its barrier while
    # rank 1 still waits in the workspace's host exchange (host timeout = device + 5 s):
    # the headers meet and every rank names both calls
    assert isinstance(exc, (CallMismatch, td.CommTimeout)), text
    assert "rank 1 called all_reduce (a call that creates the workspace" in text \
        or "rank 1 failed too" in text, text


def test_sizes_in_different_scratch_classes_debug():
    exc, text = _fault(_sizes_in_different_classes, debug=True)
    assert isinstance(exc, ValueError) and "every rank must pass the same sizes" in text, text


def test_a_failed_group_is_not_used_again():
    pool = RankPool(2, backend="cpu", heap_size=4 << 20, timeout=TIMEOUT, run_timeout=120)
    try:
        took, text = pool.run(_reuse_after_host_timeout)[0]
    finally:
        pool.close(force=True)
    assert took < 1.0, took
    assert "rank 0: ctx.barrier() was not attempted: ctx.barrier() failed earlier" in text, text
