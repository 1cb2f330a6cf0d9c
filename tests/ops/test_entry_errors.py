"""A fused op's arguments that its entry checks before any plan's build (the schedule's
name, eps, the options under "auto"; also in trident.torch.ops' functional forms). Bad on
one rank: its peers stop at once with PeerFailed naming it -- an unknown schedule on one
rank as a context's first call left the others in a host exchange until HostTimeout
(15 s), after which the process group was unusable. A misspelt option under "auto"
raised nothing (it was dropped)."""
import pytest
import torch

import trident as td

from ..faults.mismatch import assert_refused_on_the_last_rank, attempt
from .reference import make

MEET = 10.0       # the context's timeout: the peers' error must come long before it


def _first_call_bad_on_one_rank(ctx, what):
    last = ctx.world_size - 1
    bad = ctx.rank == last
    with td.init(heap_size=8 << 20, group=ctx.group, timeout=MEET) as sub:
        a = make((4 * sub.world_size, 32), 1 + sub.rank, torch.bfloat16, sub.device)
        w = make((16, 32), 7 + sub.rank, torch.bfloat16, sub.device)
        res = make((4 * sub.world_size, 16), 3, torch.bfloat16, sub.device)
        nw = make((16,), 5, torch.bfloat16, sub.device)

        def call(bad):
            if what == "schedule":
                return sub.matmul_all_reduce(a, w, schedule="fastest" if bad else "auto")
            if what == "functional":            # torch.ops.trident's Python API
                from trident.torch import ops
                return ops.matmul_all_reduce(sub, a, w, schedule="fastest" if bad else "auto")
            return sub.matmul_all_reduce_add_rmsnorm(a, w, res, nw, "1e-6" if bad else 1e-6)[0]
        got = attempt(lambda: (call(bad), sub.sync()))
        sub.reset()
        out = call(False)
        sub.sync()
        return (*got, bool(out.isnan().any()))


@pytest.mark.parametrize("what", ["schedule", "functional", "eps"])
def test_a_bad_argument_on_one_rank_stops_the_others_at_once(pool, what):
    if pool.world_size == 1:
        pytest.skip("needs two ranks")
    results = pool.run(_first_call_bad_on_one_rank, what)
    assert_refused_on_the_last_rank(
        results, "unknown schedule 'fastest'" if what != "eps"
        else "eps must be a non-negative number, got '1e-6'", MEET / 2, peers=("PeerFailed",))
    assert all("ValueError" in text for _, text, *_ in results[:-1]), results   # the cause
    assert not any(nan_after_reset for *_, nan_after_reset in results), results


def _misspelt_option(ctx):
    a = make((4 * ctx.world_size, 32), 1 + ctx.rank, torch.bfloat16, ctx.device)
    w = make((16, 32), 2, torch.bfloat16, ctx.device)
    with pytest.raises(TypeError, match=r"got \['sheduel'\]") as info:
        ctx.matmul_all_reduce(a, w, sheduel="fused")
    assert "split_k" in str(info.value)            # what the schedules do take
    out = ctx.matmul_all_reduce(a, w)              # every rank raised alike: in step
    ctx.sync()
    return bool(out.isnan().any())


def test_a_misspelt_option_under_auto_raises(pool):
    assert not any(pool.run(_misspelt_option))


def _not_tensors(ctx):
    """w (or a) that is not a 2-D tensor, e.g. a list: the error naming it, on every rank,
    from each fused op (a list for w was an AttributeError of the list: the build read the
    output's shape off w before checking it)."""
    a = make((4 * ctx.world_size, 32), 1 + ctx.rank, torch.bfloat16, ctx.device)
    w = make((16, 32), 2, torch.bfloat16, ctx.device)
    cases = [((a, w.tolist()), TypeError, "w must be a torch.Tensor, got list"),
             ((a.tolist(), w), TypeError, "a must be a torch.Tensor, got list"),
             ((a, w[0]), ValueError, r"w must be a 2-D matrix, got shape \[32\]")]
    for op in (ctx.matmul_all_reduce, ctx.matmul_reduce_scatter, ctx.all_gather_matmul):
        for args, kind, text in cases:
            with pytest.raises(kind, match=rf"^{op.__name__}: {text}$"):
                op(*args)


def test_a_list_where_a_matrix_goes_is_named(pool):
    pool.run(_not_tensors)
