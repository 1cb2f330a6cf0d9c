"""Ranks that call one collective with different algorithms, Lamport's protocol on one side
and the flag protocol on the other, with a flag launch of two programs (the CPU
emulation's most): every rank raises CallMismatch (or PeerFailed naming it) when the
ranks meet, and the outputs are poisoned. On the CPU emulation the flag launch's first
program waited for the Lamport rank to its timeout before the second arrived, and only
then did its epoch show the Lamport rank the other call (ccl/lamport.py
PROGRAMS_IN_TURN): CommTimeout on both ranks.

Two flag-protocol algorithms whose first handshake differs (push's DATA, pull's ARRIVE:
one_shot and two_shot; all_gather push and pull; all_to_all one_shot and push) each wait
for a flag the other never sets: the wait also polls the peer's other flags of the
launch, and a peer in it with another fingerprint is a CallMismatch (language/sync.py
`other_call`), not a timeout."""
import pytest
import torch

import trident as td
from trident.runtime.errors import HeapMismatchError

from .mismatch import assert_found_when_ranks_meet, mismatched_call

N = 4000          # floats: two programs of the flag kernels on the CPU emulation


def _algorithms_differ(ctx, op, pair):
    first, other = pair.split("|")
    mine = other if ctx.rank else first

    def call(n, algorithm):
        if op == "all_reduce":
            t = torch.randn(n, device=ctx.device)
            ctx.all_reduce(t, algorithm=algorithm)
            return t
        if op == "all_to_all":
            out = torch.empty(ctx.world_size * n, device=ctx.device)
            ctx.all_to_all(out, torch.randn(ctx.world_size * n, device=ctx.device),
                           algorithm=algorithm)
            return out
        out = torch.empty(ctx.world_size * n, device=ctx.device)
        ctx.all_gather(out, torch.randn(n, device=ctx.device), algorithm=algorithm)
        return out

    for name in (first, other):        # every rank makes every workspace first
        call(N, name)
    ctx.sync()
    return mismatched_call(ctx, lambda: call(N, mine), lambda: call(8, first))


@pytest.mark.parametrize("op,pair", [("all_reduce", "lamport|one_shot"),
                                     ("all_reduce", "one_shot|lamport"),
                                     ("all_reduce", "lamport|two_shot"),
                                     ("all_gather", "push|lamport"),
                                     ("all_reduce", "one_shot|two_shot"),
                                     ("all_reduce", "two_shot|one_shot"),
                                     ("all_gather", "push|pull"),
                                     ("all_gather", "pull|push"),
                                     ("all_to_all", "one_shot|push"),
                                     ("all_to_all", "push|one_shot"),
                                     ("all_to_all", "lamport|push"),
                                     ("all_to_all", "one_shot|lamport")])
def test_algorithms_that_differ_are_poisoned_and_raised(pool, op, pair):
    if pool.world_size == 1:
        pytest.skip("needs two ranks")
    assert_found_when_ranks_meet(pool.run(_algorithms_differ, op, pair), op)


def _first_calls_differ(ctx):
    """A fresh context whose first all_reduce is one_shot on rank 0 and two_shot on the
    others: each creates another workspace, which the ranks' creation barrier finds."""
    with td.init(heap_size=8 << 20, group=ctx.group, timeout=10.0) as sub:
        t = sub.ones(64)
        try:
            sub.all_reduce(t, algorithm="one_shot" if sub.rank == 0 else "two_shot")
            sub.sync()
        except HeapMismatchError as e:
            text = str(e)
        else:
            text = "no error"
        sub.reset()
        t.fill_(1.0)
        sub.all_reduce(t, algorithm="one_shot")
        assert t.eq(sub.world_size).all()
        sub.barrier()
    return text


def test_first_calls_of_different_algorithms_are_named_as_such(pool):
    if pool.world_size == 1:
        pytest.skip("needs two ranks")
    for rank, text in enumerate(pool.run(_first_calls_differ)):
        assert "the ranks created different workspaces" in text, (rank, text)
        assert "the ranks made different calls here (another algorithm" in text, (rank, text)
