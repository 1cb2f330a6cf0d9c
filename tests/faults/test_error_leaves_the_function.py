"""An error that leaves the function trident.launch runs on one rank (the last), while its
peers still wait for it: in the constructor's barrier of an ExpertParallel that rank
refused, in a barrier of their own, in a collective's kernel. The peers stop at once with
PeerFailed naming the last rank and its error (Context.leave; a barrier inside a call,
ctx.building, no longer goes past a peer's refusal of that call). They waited until
HostTimeout (the pool's timeout + 5 s), after which the process group was unusable; the
kernel, until CommTimeout. Also the refusal inside a context of its own whose next call is
that context's close(): the peers raise PeerFailed naming it (they raised CallMismatch
naming the barrier and close), and close() then raises nowhere."""
import time

import pytest
import torch

import trident as td
from trident.runtime.errors import PeerFailed

from .mismatch import attempt

LIMIT = 5.0          # seconds; the pool's waits run out at 60 (its host exchanges at 65)


def _refuse_then_leave(ctx, where):
    """The last rank raises; the others wait for it at `where` and report what they saw."""
    last = ctx.world_size - 1
    E = 2 * ctx.world_size
    if where == "constructor":
        # num_sms=0 is refused on the last rank alone, before its buffers and barrier
        td.ExpertParallel(ctx, E, 2, 32, 8, num_sms=0 if ctx.rank == last else None)
    if ctx.rank == last:
        raise RuntimeError("the function failed on the last rank")
    t = torch.ones(64, device=ctx.device)
    return attempt(ctx.barrier if where == "barrier"
                   else lambda: (ctx.all_reduce(t), ctx.sync()))


@pytest.mark.parametrize("where", ["constructor", "barrier", "all_reduce"])
def test_an_error_that_leaves_the_function_stops_the_peers_at_once(pool, where):
    if pool.world_size == 1:
        pytest.skip("needs two ranks")
    last = pool.world_size - 1
    t0 = time.perf_counter()
    with pytest.raises((ValueError, RuntimeError)) as info:
        pool.run(_refuse_then_leave, where)
    took = time.perf_counter() - t0
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert f"raised on rank {last} " in notes, notes
    refused = "num_sms must be" if where == "constructor" else "failed on the last rank"
    assert refused in str(info.value), notes
    assert took < LIMIT, f"{took:.1f} s\n{notes}"
    if where == "constructor":     # the peers' errors, as they saw them, came back too
        for rank in range(last):
            assert f"rank {rank} failed too: PeerFailed: rank {rank}: ExpertParallel" in notes
    assert not pool.closed         # reset() worked: the group is usable
    assert pool.run(_all_reduce_is_right) == [True] * pool.world_size


def _all_reduce_is_right(ctx):
    t = torch.ones(64, device=ctx.device)
    ctx.all_reduce(t)
    ctx.sync()
    return bool((t == ctx.world_size).all())


def _refused_then_close(ctx):
    last = ctx.world_size - 1
    sub = td.init(heap_size=8 << 20, group=ctx.group, timeout=10.0)
    got = attempt(lambda: td.ExpertParallel(sub, 2 * ctx.world_size, 2, 32, 8,
                                            num_sms=0 if sub.rank == last else None))
    closed = attempt(sub.close)          # the refusing rank's next call
    return got, closed


def test_refused_in_the_constructor_then_close(pool):
    if pool.world_size == 1:
        pytest.skip("needs two ranks")
    results = pool.run(_refused_then_close)
    last = pool.world_size - 1
    every = "\n".join(f"rank {r}: {x}" for r, x in enumerate(results))
    for rank, ((kind, text, took), closed) in enumerate(results):
        assert took < LIMIT, every
        assert closed[0] == "no error", every
        if rank == last:
            assert kind == "ValueError" and "num_sms must be" in text, every
        else:
            assert kind == PeerFailed.__name__, every
            assert f"rank {last}, which it waited for, failed" in text, every
            assert "num_sms must be" in text and "reset()" in text, every
