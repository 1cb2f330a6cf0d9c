"""Fuzzing ExpertParallel dispatch/combine against plain torch: random expert counts
(1-3 per rank), experts per token, hidden sizes (odd ones included) and token counts
(ranks with zero tokens likely), bf16/fp16/fp32, routing uniform or skewed (every token
to one expert, every token to one rank's experts), int32 or int64 ids, validate on or
off (off: bad ids planted now and then, which must be dropped), split mode (wait=False
then .wait()), the weights with dispatch or with combine, x plain, strided or on the
heap, expert_y strided, combine's out given (plain or heap) or not.

A case is one ExpertParallel and two rounds on it (dispatch, the experts, combine), back
to back: four op calls, each checked; in one case in four a second ExpertParallel runs
its rounds interleaved with the first's (two micro-batches in flight). Every rank draws the same case from the seed and
builds every rank's inputs; it checks the rows its experts received (as a multiset: the
order of arrival is free) and its combined output against torch.
"""
import random
from collections import Counter

import pytest
import torch

import trident as td

from ..moe.test_expert_parallel import _expert_fn, _kept, _reference_combine, _row_key
from .common import POOL_WORLDS  # noqa: F401 (this module's pools: tests/conftest.py)
from .common import num_cases, run_cases, run_family, skip_unless_fuzzed_world

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
TOL = {torch.bfloat16: 3e-2, torch.float16: 4e-3, torch.float32: 1e-5}
HIDDEN = [1, 2, 3, 5, 8, 13, 16, 24, 33, 48]
ROUNDS = 2


def _routing(gen, g, T, E, k, L, world, mode):
    """[T, k] distinct expert ids per token. mode: 'uniform'; 'one expert' (every token's
    first choice is the same expert); 'one rank' (every token's experts on one rank, when
    that rank has k of them)."""
    if T == 0:
        return torch.empty(0, k, dtype=torch.int64)
    idx = torch.rand(T, E, generator=gen).argsort(dim=1)[:, :k]
    if mode == "one expert":
        e0 = int(g.random() * E)
        for t in range(T):
            row = [e0] + [e for e in idx[t].tolist() if e != e0]
            idx[t] = torch.tensor(row[:k])
    elif mode == "one rank" and k <= L:
        r0 = int(g.random() * world)
        local = torch.rand(T, L, generator=gen).argsort(dim=1)[:, :k]
        idx = r0 * L + local
    return idx


def _plant_bad(gen, idx, E):
    """Bad ids in about one token in four: out of range, or a repeat of the token's
    first id (validate=False: the kernels must drop them)."""
    idx = idx.clone()
    if idx.shape[1] < 2:
        return idx
    for t in range(idx.shape[0]):
        u = torch.rand(2, generator=gen).tolist()
        if u[0] < 0.25:
            idx[t, 1] = (-1, E, 1 << 40, idx[t, 0].item())[int(u[1] * 4)]
    return idx


def _kept_experts(ids, E):
    """The experts a token goes to: its ids in [0, E), each once (as the kernels keep them)."""
    return {e for e in ids if 0 <= e < E}


def _expected_rows(ranks, E, rank, L):
    """For each local expert, the multiset of rows (as bytes) routed to it."""
    want = [Counter() for _ in range(L)]
    for (T, x, idx, w) in ranks:
        for t in range(T):
            for e in _kept_experts(idx[t].tolist(), E):
                if rank * L <= e < (rank + 1) * L:
                    want[e - rank * L][_row_key(x[t])] += 1
    return want


def _dispatch_check(rows_dev, want, L):
    def check(counts, _):
        rows = rows_dev.cpu()
        for le in range(L):
            n = int(counts[le])
            assert n == sum(want[le].values()), \
                f"local expert {le}: {n} rows, expected {sum(want[le].values())}"
            got = Counter(_row_key(r) for r in rows[le, :n])
            assert got == want[le], f"local expert {le}: rows differ from the tokens routed to it"
    return check


def _combine_check(dtype):
    def check(y, ref):
        assert y.shape == ref.shape, f"shape {list(y.shape)}, expected {list(ref.shape)}"
        torch.testing.assert_close(y.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])
    return check


def _dispatch_half(ctx, g, gen, ep, what, keep, checks):
    """Draw one round's inputs (every rank's) and options, dispatch, queue the dispatch
    check; returns the combine half (a function of no arguments)."""
    world, r = ctx.world_size, ctx.rank
    E, k, H, M, dtype = (ep.num_experts, ep.experts_per_token, ep.hidden_dim,
                         ep.max_num_tokens, ep.dtype)
    L, cap = ep.num_local_experts, ep.capacity
    counts = [g.choice([0, 0, 1, M, M, int(g.random() * (M + 1))]) for _ in range(world)]
    mode = g.choice(["uniform", "uniform", "one expert", "one rank"])
    idx_dtype = g.choice([torch.int64, torch.int32])
    split, early = g.random() < 0.4, g.random() < 0.4
    weights_again = early and g.random() < 0.3
    bad = not ep.validate and g.random() < 0.3
    x_where = g.choice(["plain", "plain", "strided", "heap"])
    ey_where = g.choice(["plain", "strided"])
    out_where = g.choice(["none", "none", "plain", "heap"])
    ranks = []
    for T in counts:
        x = (torch.randn(T, H, generator=gen) + 0.5).to(dtype)
        idx = _routing(gen, g, T, E, k, L, world, mode)
        if bad:
            idx = _plant_bad(gen, idx, E)
        idx = idx.to(idx_dtype).long()        # what the kernels see (int32 wraps)
        w = torch.rand(T, k, generator=gen) + 0.1
        ranks.append((T, x, idx, w))
    a = torch.rand(E, generator=gen) + 0.5
    b = torch.randn(E, generator=gen) * 0.1
    T, x, idx, w = ranks[r]
    what = (f"{what} E={E} k={k} H={H} M={M} {dtype} validate={ep.validate}: tokens per "
            f"rank={counts} routing={mode} ids={idx_dtype} bad_ids={bad} split={split} "
            f"weights_with_dispatch={early} weights_again={weights_again} x={x_where} "
            f"expert_y={ey_where} out={out_where}")
    if x_where == "strided":
        xd = torch.empty(T, H + 3, dtype=dtype, device=ctx.device)[:, 1:H + 1]
    elif x_where == "heap":
        big = ctx.empty(M * H, dtype=dtype)           # same size on every rank
        keep.append(big)
        xd = big[:T * H].view(T, H)
    else:
        xd = torch.empty(T, H, dtype=dtype, device=ctx.device)
    xd.copy_(x)
    idx_d = idx.to(idx_dtype).to(ctx.device)
    w_d = w.to(ctx.device)
    pending = ep.dispatch(xd, idx_d, wait=not split, topk_weights=w_d if early else None)

    def combine_half():
        d = pending.wait() if split else pending
        checks.append((d.expert_num_tokens.clone(), None, f"{what}: dispatch",
                       _dispatch_check(d.expert_x.clone(), _expected_rows(ranks, E, r, L), L)))
        # the experts: y = x * a[e] + b[e] over every row (padding rows unused)
        if ey_where == "strided":
            ey = torch.empty(L, cap + 2, H, dtype=dtype, device=ctx.device)[:, 2:]
        else:
            ey = torch.empty(L, cap, H, dtype=dtype, device=ctx.device)
        for le in range(L):
            ey[le] = _expert_fn(d.expert_x[le], r * L + le, a, b, dtype)
        out = None
        if out_where == "plain":
            out = torch.full((T, H), float("nan"), dtype=dtype, device=ctx.device)
        elif out_where == "heap":
            big = ctx.empty(M * H, dtype=dtype)
            keep.append(big)
            out = big[:T * H].view(T, H).fill_(float("nan"))
        cw = w_d if (not early or weights_again) else None
        y = ep.combine(ey, d, cw, wait=not split, out=out)
        y = y.wait() if split else y
        if out is not None:
            assert y is out, f"{what}: combine did not return the out it was given"
        ref = _reference_combine(T, x, *_kept(idx, w, E), a, b, dtype)
        checks.append((y.clone(), ref, f"{what}: combine", _combine_check(dtype)))
    return combine_half


def _case(ctx, seed):
    """One ExpertParallel, ROUNDS rounds; in one case in four a second ExpertParallel of
    the same shape whose rounds interleave with the first's (dispatch 1, dispatch 2,
    combine 1, combine 2: two micro-batches in flight)."""
    g = random.Random(f"moe-{seed}")
    gen = torch.Generator().manual_seed(g.randrange(1 << 30))
    L = g.choice([1, 1, 2, 3])
    E = L * ctx.world_size
    k = min(g.choice([1, 2, 2, 3, 4]), E)
    H, M = g.choice(HIDDEN), g.choice([1, 2, 3, 5, 8])
    dtype = g.choice(DTYPES)
    validate = g.random() < 0.6
    eps = [td.ExpertParallel(ctx, E, k, H, M, dtype=dtype, validate=validate)]
    if g.random() < 0.25:
        eps.append(td.ExpertParallel(ctx, E, k, H, M, dtype=dtype, validate=not validate))
    keep, checks = [], []
    try:
        for rnd in range(ROUNDS):
            halves = [_dispatch_half(ctx, g, gen, ep, f"moe seed {seed} round {rnd} ep {i} "
                                     f"of {len(eps)}: world={ctx.world_size}", keep, checks)
                      for i, ep in enumerate(eps)]
            for combine_half in halves:
                combine_half()
        ctx.barrier()
    finally:
        for ep in eps:
            ep.close()
    return checks


def _batch(ctx, seeds):
    return run_cases(ctx, _case, seeds)


def test_fuzz_expert_parallel(pool, request):
    """40 cases per fuzzed world size in CI (over world sizes 2 and 3: 80 cases, over
    160 rounds and 320 checked dispatch/combine calls); --cases N for more. One pool.run
    per world size."""
    skip_unless_fuzzed_world(pool)
    n = num_cases(request, 40)
    run_family(pool, _batch, n, batch=min(n, 75))   # CI: one pool.run
