"""all_reduce: every algorithm, dtype (floats, integers) and op on odd sizes, against plain
torch on the gathered inputs; back-to-back calls without synchronisation; identical results
on every rank."""
import pytest
import torch

from .refs import BLOCK, assert_equal, place, rank_inputs, reduce_ref

# (algorithm, dtype, op, numel, on the heap, block)
CASES = [
    ("one_shot", torch.float32, "sum", 37, False, BLOCK),
    ("one_shot", torch.bfloat16, "max", 300, True, None),
    ("one_shot", torch.float16, "min", 1, False, None),
    ("two_shot", torch.bfloat16, "sum", 300, True, BLOCK),
    ("two_shot", torch.float16, "sum", 37, False, None),
    ("two_shot", torch.float32, "max", 5, True, None),
    # integers reduce in their own type (issue 41): exact int64, int32 sums that wrap
    ("one_shot", torch.int64, "sum", 37, False, BLOCK),
    ("two_shot", torch.int32, "sum", 129, True, BLOCK),
    ("auto", torch.int8, "max", 5, False, None),
    ("two_shot", torch.uint8, "min", 70, False, None),
]


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
    per_rank = pool.run(_all_reduce_cases, CASES)
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


def _bad_inputs(ctx):
    with pytest.raises(TypeError, match="float32, int8, uint8, int32 and int64, got torch.int16"):
        ctx.all_reduce(torch.ones(4, dtype=torch.int16, device=ctx.device))
    with pytest.raises(ValueError, match="op must be one of"):
        ctx.all_reduce(torch.ones(4, device=ctx.device), op="prod")
    with pytest.raises(ValueError, match="contiguous"):
        ctx.all_reduce(torch.ones(4, 4, device=ctx.device).t())
    with pytest.raises(ValueError, match="is on meta"):
        ctx.all_reduce(torch.ones(4, device="meta"))
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
    from trident.plans import tensor_key
    picked = _auto_pick(ctx, 33 * 4)          # what "auto" picks for this size
    key = ("all_reduce", picked)
    declared, table = registry._BY_KEY[key], registry.ALGORITHMS
    floats = dataclasses.replace(declared, dtypes="float")
    registry._BY_KEY[key] = floats
    registry.ALGORITHMS = tuple(floats if a is declared else a for a in table)
    try:
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
    finally:
        registry._BY_KEY[key], registry.ALGORITHMS = declared, table


def _auto_pick(ctx, nbytes: int) -> str:
    from trident import ccl
    return ccl.select("all_reduce", nbytes, ctx.world_size, graph=False,
                      nccl=ccl._nccl_agreed(ctx))


def test_a_floats_only_algorithm_never_gets_integers(pool):
    if pool.world_size == 1:
        pytest.skip("one rank launches no kernel")
    for picked, ran in pool.run(_floats_only_algorithm):
        assert ran != picked and ran in ("one_shot", "two_shot"), (picked, ran)
