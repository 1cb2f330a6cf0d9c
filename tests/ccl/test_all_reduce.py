"""all_reduce: every algorithm of the registry (tests/algorithms.py), dtype (floats,
integers) and op on odd sizes, against plain torch on the gathered inputs; back-to-back
calls without synchronisation; identical results on every rank."""
import pytest
import torch

from .. import algorithms
from .refs import BLOCK, assert_equal, place, rank_inputs, reduce_ref

# the cases of every algorithm: (dtype, op, numel, on the heap, block); integers reduce
# in their own type (issue 41): exact int64
EVERY = [(torch.float32, "sum", 37, False, BLOCK), (torch.bfloat16, "max", 300, True, None),
         (torch.float16, "min", 1, False, None), (torch.int64, "sum", 37, False, BLOCK)]
# an algorithm's own cases besides: int32 sums that wrap, uint8; a larger lamport
OWN = {"two_shot": [(torch.int32, "sum", 129, True, BLOCK), (torch.uint8, "min", 70, False, None)],
       "lamport": [(torch.bfloat16, "sum", 4099, False, 256)]}


def cases() -> list[tuple]:
    """(algorithm, dtype, op, numel, on the heap, block): EVERY case of each algorithm
    that takes its dtype, OWN's, and one of the selector's choice ("auto")."""
    auto = ("auto", torch.int8, "max", 5, False, None)
    return algorithms.cases("all_reduce", EVERY, OWN) + [auto]


def _all_reduce_cases(ctx, cases):
    results = []
    for i, (alg, dtype, op, n, sym, block) in enumerate(cases):
        first = rank_inputs(ctx.world_size, (n,), dtype, seed=i)
        second = rank_inputs(ctx.world_size, (n,), dtype, seed=100 + i)
        a, b = place(ctx, first[ctx.rank], sym), place(ctx, second[ctx.rank], sym)
        # three launches back to back, no host synchronisation in between
        ctx.all_reduce(a, op=op, algorithm=alg, block=block)
        ctx.all_reduce(b, op=op, algorithm=alg, block=block)
        ctx.all_reduce(b, op=op, algorithm=alg, block=block)
        ctx.sync()
        expected_b = reduce_ref([reduce_ref(second, op)] * ctx.world_size, op)
        assert_equal(a, reduce_ref(first, op), f"{alg} {dtype} {op} n={n}")
        assert_equal(b, expected_b, f"{alg} {dtype} {op} n={n} (repeated)")
        results.append(a.cpu().clone())   # never return a heap view
    return results


def test_all_reduce(pool):
    per_rank = pool.run(_all_reduce_cases, cases())
    for mine in per_rank[1:]:       # bit-identical on every rank
        for got, ref in zip(mine, per_rank[0]):
            assert torch.equal(got, ref)


def _mixed_algorithms(ctx):
    """Alternating algorithms and sizes reuse the same flags and scratch halves."""
    xs = [rank_inputs(ctx.world_size, (n,), torch.float32, seed=n) for n in (70, 129, 8)]
    ts = [place(ctx, x[ctx.rank], sym) for x, sym in zip(xs, (False, True, False))]
    for t, alg in zip(ts, ("two_shot", "one_shot", "two_shot")):
        ctx.all_reduce(t, algorithm=alg, block=BLOCK)
    ctx.all_reduce(ts[2])                        # the selector's choice
    ctx.sync()
    for t, x in zip(ts[:2], xs[:2]):
        assert_equal(t, reduce_ref(x, "sum"), "mixed")
    assert_equal(ts[2], reduce_ref([reduce_ref(xs[2], "sum")] * ctx.world_size, "sum"), "mixed")


def test_all_reduce_mixed_back_to_back(pool):
    pool.run(_mixed_algorithms)


def _lamport_rounds(ctx):
    """Lamport's three buffers turn over (ccl/lamport.py, "Rounds"): ten calls back to back
    whose sizes, dtypes and grids change every call (so each round's clear must leave its
    buffer all sentinel for whatever comes three rounds later), a flag-protocol call in
    between; then signed zeros, the fp32 sentinel's value and NaN, which must travel as
    values (-0.0 as +0.0)."""
    shapes = [(37, torch.float32, 16, 3), (1000, torch.bfloat16, 64, 8), (5, torch.float16, 4, 2),
              (256, torch.float32, 256, 1), (129, torch.bfloat16, 32, 5)]
    calls = []
    for i in range(10):
        n, dtype, block, programs = shapes[i % len(shapes)]
        xs = rank_inputs(ctx.world_size, (n,), dtype, seed=300 + i)
        t = place(ctx, xs[ctx.rank], i % 2 == 1)
        ctx.all_reduce(t, algorithm="lamport", block=block, programs=programs)
        if i == 4:
            ctx.all_reduce(torch.ones(64, device=ctx.device), algorithm="one_shot")
        calls.append((t, reduce_ref(xs, "sum"), i))
    ctx.sync()
    for t, want, i in calls:
        assert_equal(t, want, f"lamport round {i}")
    if ctx.world_size == 1:     # nothing travels
        return
    odd = torch.tensor([-0.0, 0.0, float("nan"), 1.5, 0.0, -0.0], dtype=torch.float32)
    odd[4] = torch.tensor(0x80008000 - (1 << 32), dtype=torch.int32).view(torch.float32)
    for dtype in (torch.float32, torch.bfloat16):
        x = (odd if ctx.rank == 0 else torch.full_like(odd, -0.0)).to(dtype).to(ctx.device)
        ctx.all_reduce(x, algorithm="lamport")
        got = x.float().cpu()
        assert torch.isnan(got[2]) and got[3] == 1.5, got
        assert torch.equal(got[[0, 1, 4, 5]].abs(), torch.zeros(4)), got
        # a 16-bit -0.0 travels as +0.0 (fp32 keeps it: its sentinel is that denormal)
        assert torch.signbit(got[0]) == (dtype == torch.float32), got
        x = torch.full((3,), -0.0, dtype=dtype, device=ctx.device)
        ctx.all_reduce(x, op="max", algorithm="lamport")
        assert (torch.signbit(x.cpu()) == (dtype == torch.float32)).all(), x


def test_lamport_rounds_and_special_values(pool):
    pool.run(_lamport_rounds)


def _bad_inputs(ctx):
    with pytest.raises(TypeError, match="float32, int8, uint8, int32 and int64, got torch.int16"):
        ctx.all_reduce(torch.ones(4, dtype=torch.int16, device=ctx.device))
    with pytest.raises(ValueError, match="all_reduce: op must be one of"):
        ctx.all_reduce(torch.ones(4, device=ctx.device), op="prod")
    with pytest.raises(ValueError, match="contiguous"):
        ctx.all_reduce(torch.ones(4, 4, device=ctx.device).t())
    with pytest.raises(ValueError, match="is on meta"):
        ctx.all_reduce(torch.ones(4, device="meta"))
    with pytest.raises(TypeError, match="lamport"):      # its sentinel is a float's
        ctx.all_reduce(torch.ones(4, dtype=torch.int32, device=ctx.device), algorithm="lamport")
    if ctx.world_size > 1:      # one rank launches nothing, so it takes any size
        with pytest.raises(ValueError, match="'lamport' takes at most"):
            ctx.all_reduce(torch.ones(1 << 22, device=ctx.device), algorithm="lamport")
    with pytest.raises(ValueError, match="unknown algorithm 'ring'"):
        ctx.all_reduce(torch.ones(4, device=ctx.device), algorithm="ring")
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        ctx.all_reduce([1.0, 2.0])
    # sizes that differ across ranks: caught in debug mode, on every rank
    if ctx.world_size == 1:     # one rank cannot differ from itself
        return
    ctx.debug = True
    try:
        with pytest.raises(ValueError, match="every rank must pass the same sizes"):
            ctx.all_reduce(torch.ones(4 + ctx.rank, device=ctx.device))
    finally:
        ctx.debug = False


def test_all_reduce_bad_inputs(pool):
    pool.run(_bad_inputs)


def _floats_only_algorithm(ctx):
    """An algorithm declared for floating types only (registry.py `dtypes="float"`, as a
    Lamport all_reduce will be) never runs on integers: "auto" takes the first declared
    algorithm that does instead, and naming it raises TypeError."""
    import dataclasses

    from trident.ccl import registry
    from trident.runtime.plans import tensor_key
    picked = _auto_pick(ctx, 33 * 4)          # what "auto" picks for this size
    with algorithms.declared(dataclasses.replace(registry.get("all_reduce", picked),
                                                 dtypes="float")):
        xs = rank_inputs(ctx.world_size, (33,), torch.int32, seed=5)
        t = xs[ctx.rank].clone().to(ctx.device)
        ctx.all_reduce(t)
        ctx.sync()
        assert_equal(t, reduce_ref(xs, "sum"), "auto on int32, its pick floats-only")
        plan = ctx.plans._get(("all_reduce", tensor_key(t), "sum", "auto", None, None, (),
                               False))
        with pytest.raises(TypeError, match=f"{picked}' takes floating-point tensors only"):
            ctx.all_reduce(torch.ones(5, dtype=torch.int64, device=ctx.device),
                           algorithm=picked)
        return picked, plan.name


def _auto_pick(ctx, nbytes: int) -> str:
    from trident import ccl
    return ccl.select("all_reduce", nbytes, ctx.world_size, graph=False,
                      nccl=ccl._nccl_agreed(ctx))


def test_a_floats_only_algorithm_never_gets_integers(pool):
    if pool.world_size == 1:
        pytest.skip("one rank launches no kernel")
    for picked, ran in pool.run(_floats_only_algorithm):
        assert ran != picked and algorithms.takes("all_reduce", ran, torch.int32), (picked, ran)
