"""Every decision that shapes a collective's protocol is the same on every rank (issue 29
item 6): the word width, staging and the workspaces it creates, the algorithm and the
launch size may not depend on facts that differ between ranks -- where a heap view lies,
its alignment, whether a tensor is on the heap at all -- unless they change nothing that
the ranks exchange or allocate together.

The first case is the fuzz case that found it: heap views at 0, 5 and 10 fp16 elements
made rank 1 (10 bytes off a 4-byte word) stage its input and create a staging workspace
that ranks 0 and 2 did not (HeapMismatchError)."""
import pytest
import torch

from trident.ccl import common

from .refs import assert_equal, rank_inputs, reduce_ref


def _view(ctx, numel, dtype, skew, keep):
    """A heap view of `numel` elements, `skew(rank)` elements into one allocation of the
    same size on every rank."""
    whole = ctx.zeros(numel + max(skew(r) for r in range(ctx.world_size)), dtype=dtype)
    keep.append(whole)
    start = skew(ctx.rank)
    return whole[start:start + numel]


def _workspaces(ctx):
    return sorted(str(k) for k in ctx._workspaces)


def _all_gather_pull_skewed(ctx):
    """The held-out fuzz case: all_gather pull, fp16, 64 elements per rank, input and
    output heap views at 5 * rank elements."""
    w, r, n = ctx.world_size, ctx.rank, 64
    xs = rank_inputs(w, (n,), torch.float16, seed=29)
    keep = []
    out = _view(ctx, w * n, torch.float16, lambda q: 5 * q, keep)
    inp = _view(ctx, n, torch.float16, lambda q: 5 * q, keep)
    inp.copy_(xs[r])
    ctx.all_gather(out, inp, algorithm="pull")
    ctx.sync()
    assert_equal(out, torch.cat(xs), "all_gather pull fp16 at 5 * rank elements")
    ctx.barrier()                       # the heaps are the same on every rank
    for t in keep:
        ctx.free(t)
    return _workspaces(ctx)


def test_all_gather_pull_skewed_views(pool):
    if pool.world_size == 1:
        pytest.skip("one rank: nothing to agree on")
    everyone = pool.run(_all_gather_pull_skewed)
    assert all(ws == everyone[0] for ws in everyone), everyone


# (op, algorithm, dtype): the algorithms that read or write a peer's copy of the call's
# tensor, which must be on the heap (or staged there), and one of each other kind.
STAGED = [("all_gather", "pull", torch.float16), ("all_gather", "push_direct", torch.bfloat16),
          ("all_gather", "push", torch.int8), ("all_gather", "pull", torch.uint8),
          ("reduce_scatter", "pull", torch.float16), ("broadcast", "relay", torch.bool),
          ("all_reduce", "two_shot", torch.bfloat16), ("broadcast", "relay", torch.float16),
          ("broadcast", "push", torch.int32), ("all_to_all", "push", torch.float16),
          ("all_to_all", "one_shot", torch.bfloat16), ("all_to_all", "push", torch.int8)]
# Where each rank's tensors lie: an odd number of elements into a heap allocation (a
# different skew per rank), or plain on some ranks and on the heap on others.
PLACES = {"odd skews": lambda w, r: ("heap", (1, 3, 5, 0)[r % 4]),
          "plain on rank 0": lambda w, r: ("plain", 0) if r == 0 else ("heap", r),
          "plain on the last rank":
              lambda w, r: ("plain", 0) if r == w - 1 else ("heap", 2 * r + 1)}


def _put(ctx, x, place, keep, most=None):
    """x on this rank as PLACES[place] says. Every rank makes the same heap allocation:
    of `most` elements (the largest x of any rank; default x's)."""
    where, skew = PLACES[place](ctx.world_size, ctx.rank)
    whole = ctx.zeros((most or x.numel()) + 8, dtype=x.dtype)
    keep.append(whole)
    t = whole[skew:skew + x.numel()] if where == "heap" \
        else torch.empty(x.numel(), dtype=x.dtype, device=ctx.device)
    return t.view(x.shape).copy_(x)


def _one_call(ctx, op, algorithm, dtype, place, n, seed):
    w, r = ctx.world_size, ctx.rank
    keep = []
    if op == "all_gather":
        xs = rank_inputs(w, (n, 3), dtype, seed)
        inp = _put(ctx, xs[r], place, keep)
        out = _put(ctx, torch.zeros(w * n, 3, dtype=dtype), place, keep)
        ctx.all_gather(out, inp, algorithm=algorithm)
        got, expected = out, torch.cat(xs)
    elif op == "reduce_scatter":
        xs = rank_inputs(w, (w * n,), dtype, seed)
        inp = _put(ctx, xs[r], place, keep)
        out = _put(ctx, torch.zeros(n, dtype=dtype), place, keep)
        ctx.reduce_scatter(out, inp, algorithm=algorithm)
        got, expected = out, reduce_ref(xs, "sum")[r * n:(r + 1) * n]
    elif op == "all_reduce":
        xs = rank_inputs(w, (n,), dtype, seed)
        got = _put(ctx, xs[r], place, keep)
        ctx.all_reduce(got, algorithm=algorithm)
        expected = reduce_ref(xs, "sum")
    elif op == "broadcast":
        xs = rank_inputs(w, (n,), dtype, seed)
        src = (seed + 1) % w
        got = _put(ctx, xs[r], place, keep)
        ctx.broadcast(got, src=src, algorithm=algorithm)
        expected = xs[src]
    else:   # all_to_all, uneven: rank s sends s + d + 1 rows of 2 to rank d
        splits = [[s + d + 1 for d in range(w)] for s in range(w)]
        xs = rank_inputs(w, (sum(splits[-1]), 2), dtype, seed)
        xs = [x[:sum(splits[s])] for s, x in enumerate(xs)]
        sends = [sum(row) for row in splits]
        receives = [sum(splits[s][d] for s in range(w)) for d in range(w)]
        inp = _put(ctx, xs[r], place, keep, most=2 * max(sends))
        out = _put(ctx, torch.zeros(receives[r], 2, dtype=dtype), place, keep,
                   most=2 * max(receives))
        ctx.all_to_all(out, inp, out_splits=[splits[s][r] for s in range(w)],
                       in_splits=splits[r], algorithm=algorithm)
        got = out
        expected = torch.cat([xs[s].split(splits[s])[r] for s in range(w)])
    ctx.sync()
    assert_equal(got, expected, f"{op} {algorithm} {dtype} {place} n={n}")
    ctx.barrier()
    for t in keep:
        ctx.free(t)


def _staged(ctx, place):
    for i, (op, algorithm, dtype) in enumerate(STAGED):
        for n in (5, 64):
            _one_call(ctx, op, algorithm, dtype, place, n, seed=10 * i + n)
    return _workspaces(ctx)


@pytest.mark.parametrize("place", sorted(PLACES))
def test_placement_differs_by_rank(pool, place):
    """Each algorithm with tensors that lie differently on different ranks: right results,
    and the same workspaces on every rank."""
    if pool.world_size == 1:
        pytest.skip("one rank: nothing to agree on")
    everyone = pool.run(_staged, place)
    assert all(ws == everyone[0] for ws in everyone), everyone


def test_word_width():
    """The word depends on the dtype and sizes only. Never wider than an element of 2
    bytes or more (so every rank's tensor is aligned to it wherever it lies); 1-byte
    elements take the widest word their sizes allow (int8 accesses are not vectorised)."""
    for dtype, word in ((torch.float16, 2), (torch.bfloat16, 2), (torch.float32, 4),
                        (torch.int64, 4), (torch.complex128, 4)):
        size = torch.empty((), dtype=dtype).element_size()
        assert common.word_type(size, [64 * size, 8 * size])[1] == word, dtype
        assert common.word_type(size, [3 * size], unit=5 * size)[1] == word, dtype
    for dtype in (torch.bool, torch.int8, torch.uint8):
        assert common.word_type(1, [64, 8])[1] == 4, dtype
        assert common.word_type(1, [64, 6])[1] == 2, dtype
        assert common.word_type(1, [64], unit=3)[1] == 1, dtype


def _agreed_once(ctx):
    """What each rank reads for itself but every rank must use alike is agreed at a
    context's first collective (common.Agreed): debug mode on some ranks only raises
    ValueError on every rank; selector tables that differ make "auto" refuse on every
    rank, while an algorithm named still runs."""
    import trident as td
    from trident.ccl import selector
    with td.init(heap_size=4 << 20, group=ctx.group, debug=ctx.rank == 0) as c:
        for _ in range(2):                   # and again: the ranks stay in step
            with pytest.raises(ValueError, match=r"debug mode is on for rank\(s\) \[0\] only"):
                c.all_reduce(c.ones(8))
    real = selector.fingerprint
    if ctx.rank == ctx.world_size - 1:       # as if this rank had read a tuned file
        selector.fingerprint = lambda w: (12345, "tuned on this machine: /elsewhere.json")
    try:
        with td.init(heap_size=4 << 20, group=ctx.group) as c:
            t = c.ones(8)
            with pytest.raises(ValueError, match="needs the same selector tables on every rank"):
                c.all_reduce(t)
            c.all_reduce(t, algorithm="one_shot")
            c.sync()
            assert torch.equal(t.cpu(), torch.full((8,), float(ctx.world_size)))
            assert common.agreed(c).nccl == ctx.nccl_available
    finally:
        selector.fingerprint = real
    return True


def test_facts_agreed_at_the_first_collective(pool):
    if pool.world_size == 1:
        pytest.skip("one rank: nothing to agree on")
    assert all(pool.run(_agreed_once))


def _gluon_grid(ctx):
    """Gluon all_gather's grid on GPUs, where the SMs each rank may use can differ (3
    ranks on 2 GPUs: two share one, the third has the other alone; MPS caps are per
    process): a view of this rank as a GPU rank with its own share (rank 0 a whole H100,
    the others half of one), the facts agreed over the real group (common.Agreed), then
    the launch size every rank computes."""
    import types
    from trident.ccl.all_gather.gluon import launch_size
    view = types.SimpleNamespace(backend="cuda", world_size=ctx.world_size, rank=ctx.rank,
                                 usable_sms=132 if ctx.rank == 0 else 66, debug=False,
                                 heap_size=ctx.heap_size, host_exchange=ctx.host_exchange)
    facts = common.Agreed(view)
    facts.exchange(view)
    real = common.agreed
    common.agreed = lambda c: facts
    try:
        return launch_size(view, 1 << 20, 4)
    finally:
        common.agreed = real


def test_gluon_grid_is_agreed(pool):
    if pool.world_size == 1:
        pytest.skip("one rank: nothing to agree on")
    everyone = pool.run(_gluon_grid)
    assert all(size == everyone[0] for size in everyone), everyone
    assert everyone[0][1] == 66, everyone          # the smallest share: resident everywhere


def test_nccl_availability_is_the_groups():
    """Whether NCCL can serve the group is the same on every rank: 3 ranks on 2 GPUs (two
    share one, the third has the other alone) are a gloo group, which the third rank must
    know as well as the others (it alone would pick the "nccl" algorithm, or put a host
    exchange's tensor on its GPU, where its peers cannot)."""
    from trident.runtime import placement
    gpus = [("node", "gpu-0"), ("node", "gpu-0"), ("node", "gpu-1")]
    views = [placement.gpu_sharing(gpus, me) for me in gpus]
    assert [count for count, _ in views] == [2, 2, 1]
    assert [alone for _, alone in views] == [False] * 3
    gpus = [("node", "gpu-0"), ("node", "gpu-1"), ("other", "gpu-0")]
    assert [placement.gpu_sharing(gpus, me) for me in gpus] == [(1, True)] * 3
