"""torch.distributed's collectives on a "trident" default group, checked against plain
torch on every rank's inputs: odd sizes, every reduction trident serves (SUM, AVG, MAX,
MIN on bf16/fp16/fp32; SUM, MAX, MIN on integers) and one that falls back (PRODUCT),
async_op, splits for all_to_all_single, heap tensors in place, the functional collectives
(DTensor's path through torch's C++ side), what falls back (send/recv, gather, scatter)
and that it is counted, a sub-group, a mismatched size raising on every rank (at the
next call, or at destroy_process_group), and a wrong size on one rank repaired by reset."""
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from trident.runtime.errors import CallMismatch, CommTimeout, PeerFailed

from ..ccl.refs import assert_equal, rank_inputs, reduce_ref

R = dist.ReduceOp
# torch's name of the reduce-scatter and all-gather of one tensor (2.13 renamed them)
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _ref(xs, op):
    if op == R.AVG:
        return (reduce_ref(xs, "sum").float() / len(xs)).to(xs[0].dtype)
    if op == R.PRODUCT:
        out = xs[0].clone()
        for x in xs[1:]:
            out = out * x
        return out
    return reduce_ref(xs, {R.SUM: "sum", R.MAX: "max", R.MIN: "min"}[op])


def _reductions(ctx):
    """all_reduce and reduce_scatter_tensor: SUM, AVG, MAX, MIN and the float dtypes, SUM,
    MAX, MIN and the integer ones go to trident; PRODUCT to the inner group. Then the list
    form of reduce_scatter."""
    pg, w, me = dist.group.WORLD, ctx.world_size, ctx.rank
    dev = ctx.device
    before = pg.fallbacks.copy()
    # every op on fp32, each half-precision dtype with two of them (kept short: every
    # call interprets its kernel on the CPU)
    cases = [(torch.float32, op) for op in (R.SUM, R.AVG, R.MAX, R.MIN)] + \
        [(torch.bfloat16, R.SUM), (torch.bfloat16, R.AVG), (torch.float16, R.MAX),
         (torch.float16, R.SUM), (torch.int64, R.SUM), (torch.int32, R.MIN)]
    for i, (dtype, op) in enumerate(cases):
        xs = rank_inputs(w, (37,), dtype, seed=i)
        t = xs[me].clone().to(dev)
        dist.all_reduce(t, op=op)
        assert_equal(t, _ref(xs, op), f"all_reduce {dtype} {op}")
        xs = rank_inputs(w, (w * 5, 3), dtype, seed=100 + i)
        out = torch.empty(5, 3, dtype=dtype, device=dev)
        reduce_scatter_single(out, xs[me].to(dev), op=op)
        assert_equal(out, _ref(xs, op)[5 * me:5 * me + 5], f"reduce_scatter {dtype} {op}")
    assert pg.fallbacks == before, f"served by trident, yet fell back: {pg.fallbacks - before}"
    xs = rank_inputs(w, (9,), torch.float32, seed=7)
    t = xs[me].clone().to(dev)
    dist.all_reduce(t, op=R.PRODUCT)
    torch.testing.assert_close(t.cpu(), _ref(xs, R.PRODUCT))
    assert pg.fallbacks["all_reduce"] == before["all_reduce"] + 1, pg.fallbacks
    # the list form: world tensors in, one out
    xs = rank_inputs(w, (w * 4,), torch.float32, seed=9)
    out = torch.empty(4, device=dev)
    dist.reduce_scatter(out, list(xs[me].to(dev).chunk(w)))
    assert_equal(out, reduce_ref(xs, "sum")[4 * me:4 * me + 4], "reduce_scatter (lists)")
    assert pg.fallbacks["reduce_scatter"] == before["reduce_scatter"]


def test_reductions(tpool):
    tpool.run(_reductions)


def _moves(ctx):
    """all_gather_into_tensor, all_gather (lists), broadcast from the first, last and a
    middle rank, all_to_all_single even and with splits (some of them 0): several dtypes,
    odd sizes, plain and heap tensors; none falls back."""
    pg, w, me, dev = dist.group.WORLD, ctx.world_size, ctx.rank, ctx.device
    before = pg.fallbacks.copy()
    for i, (dtype, heap) in enumerate(((torch.float32, False), (torch.int16, True),
                                       (torch.bfloat16, False))):
        xs = rank_inputs(w, (37,), dtype, seed=20 + i)
        inp = ctx.empty(37, dtype=dtype).copy_(xs[me]) if heap else xs[me].to(dev)
        out = ctx.empty(w, 37, dtype=dtype) if heap else torch.empty(w, 37, dtype=dtype, device=dev)
        all_gather_single(out, inp)
        assert_equal(out, torch.stack(xs), f"all_gather_into_tensor {dtype} heap={heap}")
        if i == 0:
            outs = [torch.empty(37, dtype=dtype, device=dev) for _ in range(w)]
            dist.all_gather(outs, inp)
            assert_equal(torch.stack(outs), torch.stack(xs), f"all_gather (lists) {dtype}")
        src = (0, w - 1, w // 2)[i]
        t = xs[me].clone().to(dev)
        dist.broadcast(t, src=src)
        assert_equal(t, xs[src], f"broadcast {dtype} from {src}")
    # all_to_all_single: even splits, then rows (src + 2 * dst) % 3 from src to dst
    xs = rank_inputs(w, (w * 3, 2), torch.float32, seed=30)
    out = torch.empty(w * 3, 2, device=dev)
    dist.all_to_all_single(out, xs[me].to(dev))
    assert_equal(out, torch.cat([x[3 * me:3 * me + 3] for x in xs]), "all_to_all_single even")

    def rows(src, dst):
        return (src + 2 * dst) % 3
    in_splits = [rows(me, p) for p in range(w)]
    out_splits = [rows(p, me) for p in range(w)]
    xs = [rank_inputs(w, (sum(rows(r, p) for p in range(w)), 5), torch.float16, seed=31)[r]
          for r in range(w)]
    out = torch.empty(sum(out_splits), 5, dtype=torch.float16, device=dev)
    dist.all_to_all_single(out, xs[me].to(dev), out_splits, in_splits)
    want = [x[sum(rows(p, q) for q in range(me)):][:rows(p, me)] for p, x in enumerate(xs)]
    assert_equal(out, torch.cat(want), f"all_to_all_single splits {in_splits} -> {out_splits}")
    assert pg.fallbacks == before, f"served by trident, yet fell back: {pg.fallbacks - before}"


def test_moves(tpool):
    tpool.run(_moves)


def _async_functional_objects(ctx):
    """async_op=True: a Work that waits and holds the outputs; the functional collectives
    (DTensor's and FSDP2's route, through torch's C++ dispatcher); object collectives and
    barrier; then the ops that only the inner group serves, which are counted."""
    pg, w, me, dev = dist.group.WORLD, ctx.world_size, ctx.rank, ctx.device
    t = torch.full((13,), float(me + 1), device=dev)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    if dev.type == "cuda":
        # wait() orders the current stream after the collective and returns, as NCCL's
        # Work does; the host learns of completion once that stream has run
        torch.cuda.current_stream(dev).synchronize()
    assert work.is_completed()
    assert torch.equal(work.get_future().value()[0].cpu(), torch.full((13,), w * (w + 1) / 2))
    out = torch.empty(w * 3, device=dev)
    work = all_gather_single(out, torch.full((3,), float(me), device=dev), async_op=True)
    work.wait()
    assert out.cpu().tolist() == [float(r) for r in range(w) for _ in range(3)]
    before = pg.fallbacks.copy()
    x = torch.arange(6, dtype=torch.float32, device=dev) + me
    y = funcol.wait_tensor(funcol.all_reduce(x, "sum", pg))
    assert torch.equal(y.cpu(), sum(torch.arange(6.0) + r for r in range(w)))
    gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    y = funcol.wait_tensor(gather(x, 0, pg))
    assert torch.equal(y.cpu(), torch.cat([torch.arange(6.0) + r for r in range(w)]))
    # coalesced (torch's coalescing manager hands the group the whole batch at once)
    a, b = (torch.full((5,), float(me + k), device=dev) for k in (1, 2))
    outs = [torch.empty(2, device=dev) for _ in range(2)]
    with dist._coalescing_manager(async_ops=True) as cm:      # one kind per batch
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    with dist._coalescing_manager(async_ops=True) as cm:
        for out, k in zip(outs, (1, 2)):
            reduce_scatter_single(out, torch.full((2 * w,), float(me * k), device=dev))
    cm.wait()
    s = w * (w - 1) / 2
    assert a.cpu().tolist() == [s + w] * 5 and b.cpu().tolist() == [s + 2 * w] * 5, (a, b)
    assert [o.cpu().tolist() for o in outs] == [[s] * 2, [2 * s] * 2], outs
    assert pg.fallbacks == before, f"served by trident, yet fell back: {pg.fallbacks - before}"
    everyone = [None] * w
    dist.all_gather_object(everyone, {"rank": me})
    assert everyone == [{"rank": r} for r in range(w)]
    dist.barrier()
    # only the inner group serves these (CPU tensors: gloo serves them wherever it runs;
    # its CUDA path, where ranks share a GPU, lacks some)
    cpu = torch.device("cpu")
    if me < 2:
        t = torch.full((4,), float(me), device=cpu)
        (dist.send if me == 0 else dist.recv)(t, 1 - me)
        assert torch.equal(t, torch.zeros(4))
    g = torch.full((2,), float(me), device=cpu)
    gathered = [torch.empty(2) for _ in range(w)] if me == 0 else None
    dist.gather(g, gathered, dst=0)
    if me == 0:
        assert torch.stack(gathered)[:, 0].tolist() == [float(r) for r in range(w)]
    s = torch.empty(2)
    dist.scatter(s, [torch.full((2,), float(r)) for r in range(w)] if me == 0 else None, src=0)
    assert s.tolist() == [float(me)] * 2
    fell = pg.fallbacks - before
    assert fell["gather"] == 1 and fell["scatter"] == 1, fell
    assert fell["send" if me == 0 else "recv"] == (1 if me < 2 else 0), fell


def test_async_functional_and_fallbacks(tpool):
    tpool.run(_async_functional_objects)


def _sub_group(ctx):
    """new_group of the first half of the ranks with backend "trident": a trident context
    of its own on those ranks (a heap mapped by them), built at its first collective; the
    other ranks are not members."""
    w, me = ctx.world_size, ctx.rank
    half = list(range(w // 2))
    g = dist.new_group(half, backend="trident")
    if me not in half:
        return None
    t = torch.full((9,), float(me + 1), device=ctx.device)
    dist.all_reduce(t, group=g)
    assert torch.equal(t.cpu(), torch.full((9,), float(sum(r + 1 for r in half))))
    sub = g.context()
    assert sub is not None and sub is not ctx and sub.world_size == len(half)
    assert not g.fallbacks, g.fallbacks
    return sub.world_size


def test_new_group_of_a_subset_builds_its_own_context(tpool):
    sizes = tpool.run(_sub_group)
    w = len(sizes)
    assert sizes == [w // 2] * (w // 2) + [None] * (w - w // 2)


def _sizes_differ(ctx):
    """Rank 0 all-reduces 100 elements, the others 200: the output is NaN and the next
    call raises CallMismatch (or PeerFailed naming it) on every rank; after ctx.reset()
    the next call is right."""
    dev = ctx.device
    for n in (100, 200):        # compiled first: a peer still compiling would time out
        dist.all_reduce(torch.ones(n, device=dev))
    dist.barrier()
    t = torch.randn(100 if ctx.rank == 0 else 200, device=dev)
    dist.all_reduce(t)
    poisoned = bool(t.isnan().all())
    try:
        dist.all_reduce(torch.ones(8, device=dev))
        raised = None
    except Exception as exc:        # noqa: BLE001 -- the test inspects what came
        raised = (type(exc).__name__, str(exc))
    ctx.reset()
    t = torch.full((8,), float(ctx.rank + 1), device=dev)
    dist.all_reduce(t)
    return poisoned, raised, t.cpu().tolist()


def test_a_mismatched_size_raises_on_every_rank(tpool):
    w = tpool.world_size
    # on one GPU shared by the ranks such cases have ended as CommTimeout (README,
    # Reliability): raised on every rank too, without naming the mismatch
    kinds = (CallMismatch.__name__, PeerFailed.__name__) + \
        ((CommTimeout.__name__,) if tpool.backend == "cuda" else ())
    for rank, (poisoned, raised, after) in enumerate(tpool.run(_sizes_differ)):
        assert poisoned, f"rank {rank}: the output of a mismatched call is not NaN"
        assert raised is not None, f"rank {rank}: the call after the mismatch did not raise"
        assert raised[0] in kinds, (rank, raised)
        assert raised[0] == CommTimeout.__name__ or "different call" in raised[1], raised
        assert after == [w * (w + 1) / 2] * 8, after


def _wrong_size_on_one_rank(ctx):
    """Issue 41 item 1 through the torch backend: rank 0 calls reduce_scatter_tensor with
    an input of the wrong size as a new trident group's first call (the others' first
    collective agrees on the context's facts: a host exchange rank 0 never makes). Rank 0
    raises ValueError, the others PeerFailed naming it, at once; reset() on every rank, and
    a correct call is right; then destroy_process_group raises nothing. Then item 4: sizes
    that differ in the group's last call, and destroy_process_group raises the mismatch."""
    from trident.torch.backend import Options, context
    w, dev = ctx.world_size, ctx.device
    g = dist.new_group(backend="trident", pg_options=Options(heap_size=8 << 20, timeout=20.0))
    out = torch.empty(6, device=dev)
    t0 = time.perf_counter()
    try:
        reduce_scatter_single(out, torch.ones(6 * w + (ctx.rank == 0), device=dev), group=g)
        context(g).sync()
        raised = None
    except Exception as exc:        # noqa: BLE001 -- the test inspects what came
        raised = (type(exc).__name__, str(exc), time.perf_counter() - t0)
    context(g).reset()
    xs = rank_inputs(w, (6 * w,), torch.int32, seed=11)
    out = torch.empty(6, dtype=torch.int32, device=dev)
    reduce_scatter_single(out, xs[ctx.rank].to(dev), group=g)
    right = torch.equal(out.cpu(), reduce_ref(xs, "sum")[6 * ctx.rank:6 * ctx.rank + 6])
    dist.destroy_process_group(g)
    g = dist.new_group(backend="trident", pg_options=Options(heap_size=8 << 20, timeout=20.0))
    for n in (10, 20):          # compiled first: a peer still compiling would time out
        dist.all_reduce(torch.ones(n, device=dev), group=g)
    dist.barrier(group=g)
    dist.all_reduce(torch.randn(10 if ctx.rank == 0 else 20, device=dev), group=g)
    try:
        dist.destroy_process_group(g)
        at_destroy = None
    except Exception as exc:        # noqa: BLE001
        at_destroy = (type(exc).__name__, str(exc))
    return raised, right, at_destroy


def test_a_wrong_size_on_one_rank_is_repaired_by_reset(tpool):
    for rank, (raised, right, at_destroy) in enumerate(tpool.run(_wrong_size_on_one_rank)):
        assert raised is not None and raised[2] < 5, (rank, raised)
        if rank == 0:
            assert raised[0] == "ValueError" and "reduce_scatter_tensor" in raised[1], raised
        else:
            assert raised[0] == PeerFailed.__name__, (rank, raised)
            assert "rank 0" in raised[1] and "ValueError" in raised[1], raised
        assert right, f"rank {rank}: the call after reset() is wrong"
        assert at_destroy is not None, f"rank {rank}: destroy_process_group hid the mismatch"
        assert at_destroy[0] in (CallMismatch.__name__, PeerFailed.__name__), at_destroy
        assert "all_reduce" in at_destroy[1], at_destroy
