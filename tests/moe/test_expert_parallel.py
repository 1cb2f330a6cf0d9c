"""ExpertParallel dispatch/combine against plain torch on the inputs of every rank.

Every rank builds the inputs of all ranks from one seed (what an all_gather would give),
runs its own part through trident, and checks its experts' rows and its combined output
against a reference computed in plain torch.
"""
from collections import Counter

import pytest
import torch

import trident as td
from trident.runtime.launch import default_backend

TOL = {torch.bfloat16: 3e-2, torch.float16: 4e-3}


def _routing(g, T, E, k):
    """T tokens, k distinct experts each, uniformly random."""
    if T == 0:
        return torch.empty(0, k, dtype=torch.int64)
    return torch.rand(T, E, generator=g).argsort(dim=1)[:, :k]


def _round_inputs(seed, world, E, k, H, M, dtype, counts=None):
    """Inputs of every rank for one round: (T, x, topk_idx, topk_weights) per rank, and
    the per-expert function the 'experts' apply (y = x * a[e] + b[e])."""
    g = torch.Generator().manual_seed(seed)
    if counts is None:
        counts = torch.randint(0, M + 1, (world,), generator=g).tolist()
    ranks = []
    for T in counts:
        x = (torch.randn(T, H, generator=g) + 0.5).to(dtype)
        idx = _routing(g, T, E, k)
        w = torch.rand(T, k, generator=g) + 0.1
        ranks.append((T, x, idx, w))
    a = torch.rand(E, generator=g) + 0.5
    b = torch.randn(E, generator=g) * 0.1
    return ranks, a, b


def extreme_counts(world, M):
    """Tokens per rank for a first round: the extremes, none on rank 0 and a full batch
    on rank 1 (M // 2 on the others); a full batch where there is one rank."""
    return [0, M] + [M // 2] * (world - 2) if world > 1 else [M]


def _expert_fn(x, e, a, b, dtype):
    return (x.float() * a[e] + b[e]).to(dtype)


def _row_key(row):
    return row.contiguous().view(torch.int16).numpy().tobytes()


def _check_dispatch(ctx, d, ranks, L):
    cnt = d.expert_num_tokens.cpu()
    for le in range(L):
        e = ctx.rank * L + le
        want = Counter(_row_key(x[t]) for (T, x, idx, w) in ranks for t in range(T)
                       if e in idx[t].tolist())
        n = int(cnt[le])
        assert n == sum(want.values()), f"expert {e}: {n} rows, expected {sum(want.values())}"
        got = Counter(_row_key(r) for r in d.expert_x[le, :n].cpu())
        assert got == want, f"expert {e}: received rows differ from the tokens routed to it"


def _run_experts(ctx, d, L, a, b, dtype):
    ey = torch.empty_like(d.expert_x)
    cnt = d.expert_num_tokens.cpu()
    for le in range(L):
        n = int(cnt[le])
        ey[le, :n] = _expert_fn(d.expert_x[le, :n], ctx.rank * L + le, a, b, dtype)
    return ey


def _reference_combine(T, x, idx, w, a, b, dtype):
    ref = torch.zeros(T, x.shape[1])
    for j in range(idx.shape[1]):
        e = idx[:, j]
        ref += w[:, j:j + 1] * (x.float() * a[e][:, None] + b[e][:, None]).to(dtype).float()
    return ref


def _check_combine(y, T, x, idx, w, a, b, dtype):
    ref = _reference_combine(T, x, idx, w, a, b, dtype)
    assert y.shape == (T, x.shape[1]) and y.dtype == dtype
    tol = TOL[dtype]
    torch.testing.assert_close(y.float().cpu(), ref, atol=tol, rtol=tol)


def _rounds(ctx, E, k, H, M, dtype, seeds, idx_dtype=torch.int64, split=False, reset=False):
    # E must be a multiple of the world size: keep the case's E where it is, else the
    # nearest lower multiple (e.g. 12 experts become 8 at 8 ranks)
    E = max(E // ctx.world_size, 1) * ctx.world_size
    ep = td.ExpertParallel(ctx, E, k, H, M, dtype=dtype)
    L = E // ctx.world_size
    try:
        for i, seed in enumerate(seeds):
            counts = None
            if i == 0:
                counts = extreme_counts(ctx.world_size, M)
            ranks, a, b = _round_inputs(seed, ctx.world_size, E, k, H, M, dtype, counts)
            T, x, idx, w = ranks[ctx.rank]
            x, idx, w = x.to(ctx.device), idx.to(idx_dtype).to(ctx.device), w.to(ctx.device)
            early = split and i % 2 == 1      # weights sent with the tokens
            if split:
                h = ep.dispatch(x, idx, wait=False, topk_weights=w if early else None)
                other = torch.randn(32, 32, device=ctx.device) @ torch.randn(32, 32, device=ctx.device)    # work between the halves
                d = h.wait()
            else:
                d = ep.dispatch(x, idx)
            _check_dispatch(ctx, d, ranks, L)
            ey = _run_experts(ctx, d, L, a, b, dtype)
            if split:
                h = ep.combine(ey, d, None if early else w, wait=False)
                other = other + 1
                y = h.wait()
            else:
                y = ep.combine(ey, d, w)
            _check_combine(y, T, x.cpu(), idx.cpu(), w.cpu(), a, b, dtype)
            if reset:              # as after a call that failed on rank 0 only:
                if ctx.rank == 0:  # its epochs ran ahead of the other ranks'
                    ep.buf.state[:4] += 1
                ctx.reset()        # ...and ctx.reset() brings every rank back in step
        ctx.barrier()
    finally:
        ep.close()


@pytest.mark.parametrize("E,k,H,dtype", [
    (12, 3, 96, torch.bfloat16),      # several experts per rank, H not a power of two
    (12, 1, 80, torch.float16),       # top-1
    (24, 4, 64, torch.bfloat16),
], ids=["e12k3h96-bf16", "e12k1h80-fp16", "e24k4h64-bf16"])
def test_matches_reference(pool, E, k, H, dtype):
    pool.run(_rounds, E, k, H, 5, dtype, [11, 12])


def test_works_again_after_context_reset(pool):
    pool.run(_rounds, 12, 2, 64, 5, torch.bfloat16, [21, 22, 23], torch.int64, False, True)


def test_one_expert_per_rank_int32_ids(pool):
    E = pool.world_size
    pool.run(_rounds, E, min(2, E), 72, 4, torch.bfloat16, [21, 22], torch.int32)


def test_split_mode_with_work_between_halves(pool):
    pool.run(_rounds, 12, 2, 64, 4, torch.bfloat16, [31, 32, 33], torch.int64, True)


def _back_to_back(ctx, iters):
    """Many rounds on one ExpertParallel, plus dispatch-only and combine-only repeats (as a
    benchmark runs them): epochs and buffer halves must keep every round separate."""
    E, k, H, M, dtype = 2 * ctx.world_size, 2, 64, 3, torch.bfloat16
    ep = td.ExpertParallel(ctx, E, k, H, M, dtype=dtype, validate=False)
    L = E // ctx.world_size
    try:
        for i in range(iters):
            ranks, a, b = _round_inputs(100 + i, ctx.world_size, E, k, H, M, dtype)
            T, x, idx, w = ranks[ctx.rank]
            repeat_dispatch = 1 + (i % 3 == 1) * 2
            for _ in range(repeat_dispatch):
                d = ep.dispatch(x.to(ctx.device), idx.to(ctx.device))
            ey = _run_experts(ctx, d, L, a, b, dtype)
            for _ in range(1 + (i % 4 == 2)):
                y = ep.combine(ey, d, w.to(ctx.device))
            if i % 3 == 2:     # weights with the tokens; combine-only repeats use them too
                d = ep.dispatch(x.to(ctx.device), idx.to(ctx.device), topk_weights=w.to(ctx.device))
                ey = _run_experts(ctx, d, L, a, b, dtype)
                for _ in range(2):
                    y = ep.combine(ey, d)
            _check_combine(y, T, x, idx, w, a, b, dtype)
        ctx.barrier()
    finally:
        ep.close()


def test_many_back_to_back_rounds(pool):
    pool.run(_back_to_back, 12)


def _bad_inputs(ctx):
    E, k, H, M = max(4 * ctx.world_size, 6), 2, 64, 4     # idx below names experts 0-5
    if ctx.world_size > 1:      # every count is a multiple of one
        with pytest.raises(ValueError, match="multiple of the world size"):
            td.ExpertParallel(ctx, ctx.world_size + 1, 1, H, M)
    with pytest.raises(ValueError, match="exceeds num_experts"):
        td.ExpertParallel(ctx, ctx.world_size, ctx.world_size + 1, H, M)
    with pytest.raises(TypeError, match="dtype"):
        td.ExpertParallel(ctx, E, k, H, M, dtype=torch.int32)
    with pytest.raises(TypeError, match="^ExpertParallel: ctx must be a trident context .*"
                                        "got NoneType$"):   # was an AttributeError
        td.ExpertParallel(None, E, k, H, M)
    ep = td.ExpertParallel(ctx, E, k, H, M)
    try:
        x = torch.randn(3, H, device=ctx.device).to(torch.bfloat16)
        idx = torch.tensor([[0, 1], [2, 3], [4, 5]], device=ctx.device)
        w = torch.rand(3, k, device=ctx.device)
        with pytest.raises(ValueError, match="exceeds max_num_tokens"):
            ep.dispatch(torch.randn(M + 1, H, device=ctx.device).to(torch.bfloat16), torch.zeros(M + 1, k, dtype=torch.long, device=ctx.device))
        with pytest.raises(TypeError, match="x must be torch.bfloat16"):
            ep.dispatch(x.half(), idx)
        with pytest.raises(ValueError, match=r"x must be \[T, 64\]"):
            ep.dispatch(torch.randn(3, H + 1, device=ctx.device).to(torch.bfloat16), idx)
        with pytest.raises(TypeError, match="int32 or int64"):
            ep.dispatch(x, idx.float())
        with pytest.raises(ValueError, match="topk_idx must be"):
            ep.dispatch(x, idx[:, :1])
        with pytest.raises(ValueError, match="x must have contiguous rows"):
            ep.dispatch(torch.randn(H, 3, device=ctx.device).to(torch.bfloat16).t(), idx)
        with pytest.raises(TypeError, match="^dispatch: topk_idx must be a torch.Tensor, "
                                            "got list$"):
            ep.dispatch(x, idx.tolist())
        # nothing above reached a kernel: a correct round still works on every rank
        d = ep.dispatch(x, idx)
        ey = torch.zeros_like(d.expert_x)
        with pytest.raises(TypeError, match="topk_weights must be float32"):
            ep.combine(ey, d, w.double())
        with pytest.raises(ValueError, match="topk_weights must be"):
            ep.combine(ey, d, w[:2])
        with pytest.raises(ValueError, match="expert_y must be"):
            ep.combine(ey[:, :1], d, w)
        with pytest.raises(TypeError, match="expert_y must be"):
            ep.combine(ey.half(), d, w)
        with pytest.raises(ValueError, match="expert_y must have contiguous rows"):
            ep.combine(ey.transpose(1, 2).contiguous().transpose(1, 2), d, w)
        with pytest.raises(ValueError, match="topk_weights is needed"):
            ep.combine(ey, d)
        with pytest.raises(TypeError, match="Dispatched"):
            ep.combine(ey, ep, w)
        with pytest.raises(TypeError, match=r"^combine: expert_y must be a torch.Tensor "
                                            r"\[L, cap, H\] = .*, got list$"):
            ep.combine([ey], d, w)
        with pytest.raises(TypeError, match=r"^combine: topk_weights must be a torch.Tensor "
                                            r"\[T, experts_per_token\] = \[3, 2\] \(or None\), "
                                            r"got list$"):
            ep.combine(ey, d, w.tolist())
        y = ep.combine(ey, d, w)
        assert y.shape == (3, H)
        d2 = ep.dispatch(x, idx)
        with pytest.raises(ValueError, match="earlier dispatch"):
            ep.combine(ey, d, w)
        ep.combine(ey, d2, w)
        ctx.barrier()
    finally:
        ep.close()
    # a closed one names itself (its calls were AttributeErrors of its freed buffers)
    with pytest.raises(RuntimeError, match="^dispatch: this ExpertParallel is closed"):
        ep.dispatch(x, idx)
    with pytest.raises(RuntimeError, match="^combine: this ExpertParallel is closed"):
        ep.combine(ey, d2, w)


def test_bad_input_raises_clear_errors(pool):
    pool.run(_bad_inputs)


def _graph_replay(ctx, replays):
    E, k, H, M, dtype = 8 * ctx.world_size, 4, 2880, 64, torch.bfloat16
    ep = td.ExpertParallel(ctx, E, k, H, M, dtype=dtype, validate=False)
    L = E // ctx.world_size
    x = torch.empty(M, H, dtype=dtype, device=ctx.device)
    idx = torch.empty(M, k, dtype=torch.int64, device=ctx.device)
    w = torch.empty(M, k, device=ctx.device)
    ey = torch.empty(L, ep.capacity, H, dtype=dtype, device=ctx.device)

    def step():
        d = ep.dispatch(x, idx)
        ey.copy_(d.expert_x)       # identity experts
        return ep.combine(ey, d, w)

    ctx.barrier()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()                     # compile and warm up outside the graph
    torch.cuda.current_stream().wait_stream(s)
    ctx.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = step()
    ctx.barrier()
    for i in range(replays):
        ranks, a, b = _round_inputs(300 + i, ctx.world_size, E, k, H, M, dtype,
                                    [M] * ctx.world_size)
        T, xi, ii, wi = ranks[ctx.rank]
        x.copy_(xi)
        idx.copy_(ii)
        w.copy_(wi)
        graph.replay()
        ref = (wi.sum(dim=1, keepdim=True) * xi.float())
        torch.testing.assert_close(y.float().cpu(), ref, atol=3e-2, rtol=3e-2)
    ctx.barrier()
    ep.close()


@pytest.mark.skipif(default_backend() != "cuda", reason="CUDA graphs need GPUs")
def test_graph_replay(pool):
    pool.run(_graph_replay, 20)


def _kept(idx, w, E):
    """What the kernels make of routing with bad ids: ids out of [0, E) and repeats of an
    earlier id of the same token are dropped. Returns ids (dropped -> 0) and weights
    (dropped -> 0), so the plain reference sums over the kept experts only."""
    idx, w = idx.clone(), w.clone()
    for t in range(idx.shape[0]):
        seen = set()
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            if not 0 <= e < E or e in seen:
                idx[t, j], w[t, j] = 0, 0.0
            seen.add(e)
    return idx, w


def _round(ctx, ep, seed, L, edit=None, **dispatch_options):
    """One dispatch + experts + combine round on random inputs, checked against torch.
    `edit(rank, idx)` may plant bad ids in a rank's routing (int64, on the host)."""
    E, k, H, M, dtype = (ep.num_experts, ep.experts_per_token, ep.hidden_dim,
                         ep.max_num_tokens, ep.dtype)
    ranks, a, b = _round_inputs(seed, ctx.world_size, E, k, H, M, dtype, [M] * ctx.world_size)
    if edit is not None:
        ranks = [(T, x, edit(r, idx.clone()), w) for r, (T, x, idx, w) in enumerate(ranks)]
    T, x, idx, w = ranks[ctx.rank]
    d = ep.dispatch(x.to(ctx.device), idx.to(ctx.device), **dispatch_options)
    _check_dispatch(ctx, d, ranks, L)
    y = ep.combine(_run_experts(ctx, d, L, a, b, dtype), d, w.to(ctx.device))
    _check_combine(y, T, x, *_kept(idx, w, E), a, b, dtype)


def _plant(kind, rows):
    """An edit for _round: a bad id of `kind` in token 1 of the ranks in `rows`."""
    def edit(rank, idx):
        if rank in rows:
            if kind == "range":
                idx[1, 1] = -1 if rank % 2 else 10 ** 6
            elif kind == "int64":    # cut to 32 bits, it would be a valid new expert
                idx[1, 1] = (1 << 32) + min(set(range(idx.shape[1] + 1)) - set(idx[1].tolist()))
            else:
                idx[1, 1] = idx[1, 0]
        return idx
    return edit


MESSAGES = {
    "range": r"dispatch: topk_idx\[1, 1\] = (-1|1000000) is not an expert id in \[0, \d+\)",
    "int64": r"dispatch: topk_idx\[1, 1\] = 4294967\d{3} is not an expert id in \[0, \d+\)",
    "repeat": r"dispatch: token 1 lists expert \d+ twice \(topk_idx\[1, 0\] and topk_idx\[1, 1\]\)",
}


def _bad_ids(ctx):
    """Bad expert ids are dropped on the device and raised at the next sync (on the rank
    that passed them) or barrier (on every rank), at once in debug mode; the other tokens'
    results are right."""
    E, k, H, M = 3 * ctx.world_size, 3, 48, 4
    ep = td.ExpertParallel(ctx, E, k, H, M, dtype=torch.bfloat16)
    L, everyone, debug = E // ctx.world_size, set(range(ctx.world_size)), ctx.debug
    try:
        ctx.debug = False
        for i, kind in enumerate(MESSAGES):
            _round(ctx, ep, 500 + i, L, _plant(kind, everyone))
            with pytest.raises(ValueError, match=MESSAGES[kind]):
                ctx.sync()
            ctx.sync()                           # raised once: the record is cleared
        # at a barrier: every rank raises rank 0's error (so all stay in step)
        _round(ctx, ep, 510, L, _plant("repeat", {0}))
        with pytest.raises(ValueError, match=MESSAGES["repeat"] + r" \(on rank 0;"):
            ctx.barrier()
        ctx.barrier()
        # validate=False: still dropped, not recorded
        _round(ctx, ep, 511, L, _plant("range", everyone), validate=False)
        ctx.sync()
        # debug mode: raised by dispatch itself; the ranks stay in step
        ctx.debug = True
        ranks, _, _ = _round_inputs(512, ctx.world_size, E, k, H, M, torch.bfloat16,
                                    [M] * ctx.world_size)
        T, x, idx, w = ranks[ctx.rank]
        x = x.to(ctx.device)
        with pytest.raises(ValueError, match=MESSAGES["int64"]):
            ep.dispatch(x, _plant("int64", everyone)(ctx.rank, idx.clone()).to(ctx.device))
        pending = ep.dispatch(x, _plant("repeat", everyone)(ctx.rank, idx.clone()).to(ctx.device),
                              wait=False)
        with pytest.raises(ValueError, match=MESSAGES["repeat"]):
            pending.wait()                       # split: raised after the receive half
        _round(ctx, ep, 513, L)
        ctx.barrier()
    finally:
        ctx.debug = debug
        ep.close()


def test_bad_expert_ids_raise_at_sync(pool):
    pool.run(_bad_ids)


def _plans(ctx):
    """A call's host work is done once per signature: the second identical call only
    launches (and sees the tensors' new contents), a new signature builds a new plan."""
    E, k, H, M, dtype = 2 * ctx.world_size, 2, 40, 4, torch.bfloat16
    ep = td.ExpertParallel(ctx, E, k, H, M, dtype=dtype)
    L = E // ctx.world_size
    x = torch.empty(M, H, dtype=dtype, device=ctx.device)
    idx = torch.empty(k, M, dtype=torch.int64, device=ctx.device).t()    # strided ids
    w = torch.empty(M, k, device=ctx.device)
    ey = torch.empty(L, ep.capacity + 1, H, dtype=dtype, device=ctx.device)[:, 1:]
    out = torch.empty(M, H, dtype=dtype, device=ctx.device)
    plans = ctx.plans

    def round_(seed, wait=True, early=False, into=None):
        ranks, a, b = _round_inputs(seed, ctx.world_size, E, k, H, M, dtype,
                                    [M] * ctx.world_size)
        T, xi, ii, wi = ranks[ctx.rank]
        x.copy_(xi), idx.copy_(ii), w.copy_(wi)
        d = ep.dispatch(x, idx, wait=wait, topk_weights=w if early else None)
        d = d if wait else d.wait()
        _check_dispatch(ctx, d, ranks, L)
        ey.copy_(_run_experts(ctx, d, L, a, b, dtype))
        y = ep.combine(ey, d, None if early else w, wait=wait, out=into)
        y = y if wait else y.wait()
        _check_combine(y, T, xi, ii, wi, a, b, dtype)
        return y

    try:
        builds, hits = plans.builds, plans.hits
        round_(600)
        assert (plans.builds - builds, plans.hits - hits) == (2, 0)
        round_(601)                            # same tensors, new contents: no new plan
        assert (plans.builds - builds, plans.hits - hits) == (2, 2)
        round_(602, wait=False)                # split: send halves, receive halves
        round_(603, wait=False)
        assert (plans.builds - builds, plans.hits - hits) == (6, 6)
        round_(604, early=True)                # weights with the tokens: new signatures
        assert plans.builds - builds == 8
        assert round_(605, into=out) is out    # an out of the caller's: its own plan...
        other = torch.empty_like(out)
        assert round_(606, into=other) is other   # ...kept for an out at another address
        assert (plans.builds - builds, plans.hits - hits) == (9, 9)
        ctx.barrier()
    finally:
        ep.close()
    assert len(plans) == 0                     # freeing the buffers dropped the plans


def test_plans_are_reused_and_rebuilt(pool):
    pool.run(_plans)
