"""all_to_all: even and uneven splits (zero rows included), plain and heap outputs,
several dtypes, back to back; against the rows each peer sent."""
import pytest
import torch

from .refs import BLOCK, assert_equal, place, rank_inputs


def _rows(src, dst):
    """Rows rank src sends to rank dst in the uneven case (some are zero)."""
    return (src * 3 + dst * 5 + 1) % 4


def _all_to_all_cases(ctx):
    w, r = ctx.world_size, ctx.rank
    cases = [("even", torch.float32, (3,), False, BLOCK), ("uneven", torch.bfloat16, (4,), True, None),
             ("uneven", torch.int8, (3,), False, BLOCK), ("even", torch.float16, (), True, None)]
    checks = []
    for i, (kind, dtype, row, sym, block) in enumerate(cases):     # back to back, no sync
        if kind == "even":
            splits = [[2] * w for _ in range(w)]
        else:
            splits = [[_rows(s, d) for d in range(w)] for s in range(w)]
        xs = [x for x in rank_inputs(w, (sum(splits[0]) * 0 + 64, *row), dtype, seed=i)]
        xs = [x[:sum(splits[s])] for s, x in enumerate(xs)]
        in_splits, out_splits = splits[r], [splits[s][r] for s in range(w)]
        out = place(ctx, torch.full((sum(out_splits), *row), 7, device=ctx.device).to(dtype), sym)
        kw = {} if kind == "even" else {"out_splits": out_splits, "in_splits": in_splits}
        ctx.all_to_all(out, xs[r].to(ctx.device), block=block, **kw)
        expected = torch.cat([xs[s].split(splits[s])[r] for s in range(w)])
        checks.append((out, expected, f"{kind} {dtype} {row}"))
    ctx.sync()
    for out, expected, what in checks:
        assert_equal(out, expected, what)


def test_all_to_all(pool):
    pool.run(_all_to_all_cases)


def _bad_inputs(ctx):
    w = ctx.world_size
    with pytest.raises(ValueError, match="not a multiple of world size"):
        ctx.all_to_all(torch.empty(w + 1, device=ctx.device), torch.ones(w + 1, device=ctx.device))
    with pytest.raises(ValueError, match="in_splits must be"):
        ctx.all_to_all(torch.empty(w, device=ctx.device), torch.ones(w, device=ctx.device), out_splits=[1] * w, in_splits=[2] * w)
    with pytest.raises(ValueError, match="same shape after dim 0"):
        ctx.all_to_all(torch.empty(w, 2, device=ctx.device), torch.ones(w, 3, device=ctx.device))
    # rank 0 sends its peers a row more than they expect: caught in debug mode
    in_splits = [2] * w
    if ctx.rank == 0:
        in_splits[0], in_splits[1] = 1, 3
    ctx.debug = True
    try:
        with pytest.raises(ValueError, match="differs from rank p's out_splits"):
            ctx.all_to_all(torch.empty(2 * w, device=ctx.device), torch.ones(2 * w, device=ctx.device), out_splits=[2] * w,
                           in_splits=in_splits)
    finally:
        ctx.debug = False


def test_all_to_all_bad_inputs(pool):
    pool.run(_bad_inputs)
