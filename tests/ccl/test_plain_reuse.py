"""A collective on a plain tensor (not on the heap) at a new address, of a shape, strides,
dtype and options already seen, reuses that signature's plan (ccl/__init__.py
`_plain_key`, Plan.plain): one build for many addresses, right every time. Every
collective and algorithm, in place and with a given out, odd sizes, a heap tensor beside
a plain one, a byte view off a word boundary (another plan, then reused), overlapping
plain tensors (the address-keyed path), and no plain tensor kept alive by the plan."""
import gc
import weakref

import pytest
import torch

from trident.runtime.plans import tensor_key

from ..algorithms import kernels, takes
from .refs import assert_equal, rank_inputs, reduce_ref

CALLS = 4


def _fresh(x, device, keep):
    """A plain copy of `x` at an address none of `keep` has (they stay alive)."""
    t = x.clone().to(device)
    keep.append(t)
    return t


def _builds_once(ctx, what, calls):
    """Run calls() CALLS times, each on new plain tensors: one signature, one build (two
    on GPUs: the capture's twin)."""
    plans = ctx.plans
    builds = plans.builds
    for i in range(CALLS):
        calls(i)
        ctx.sync()
        assert plans.builds == builds + 1 + (ctx.backend == "cuda"), \
            f"{what}: call {i} built a plan ({plans.builds - builds} builds)"


def _every_collective(ctx):
    w, me, dev = ctx.world_size, ctx.rank, ctx.device
    keep = []
    for alg in ["auto"] + kernels("all_reduce"):
        if alg != "auto" and not takes("all_reduce", alg, torch.float32):
            continue
        xs = [rank_inputs(w, (37, 3), torch.float32, seed=10 + i) for i in range(CALLS)]

        def all_reduce(i):
            t = _fresh(xs[i][me], dev, keep)
            assert ctx.all_reduce(t, algorithm=alg) is t
            ctx.sync()
            assert_equal(t, reduce_ref(xs[i], "sum"), f"all_reduce {alg} call {i}")
        _builds_once(ctx, f"all_reduce {alg}", all_reduce)

    for alg in ["auto"] + kernels("all_gather"):
        xs = [rank_inputs(w, (5, 3), torch.bfloat16, seed=20 + i) for i in range(CALLS)]

        def all_gather(i):
            out = _fresh(torch.empty(5 * w, 3, dtype=torch.bfloat16), dev, keep)
            ctx.all_gather(out, _fresh(xs[i][me], dev, keep), algorithm=alg)
            ctx.sync()
            assert_equal(out, torch.cat(xs[i]), f"all_gather {alg} call {i}")
        _builds_once(ctx, f"all_gather {alg}", all_gather)

    for alg in ["auto"] + kernels("reduce_scatter"):
        if alg != "auto" and not takes("reduce_scatter", alg, torch.float32):
            continue
        xs = [rank_inputs(w, (7 * w, 2), torch.float32, seed=30 + i) for i in range(CALLS)]

        def reduce_scatter(i):
            out = _fresh(torch.empty(7, 2), dev, keep)
            ctx.reduce_scatter(out, _fresh(xs[i][me], dev, keep), op="max", algorithm=alg)
            ctx.sync()
            assert_equal(out, reduce_ref(xs[i], "max")[7 * me:7 * (me + 1)],
                         f"reduce_scatter {alg} call {i}")
        _builds_once(ctx, f"reduce_scatter {alg}", reduce_scatter)

    # uneven splits: rank r sends (r + p) % 3 + 1 rows to rank p
    sends = [[(r + p) % 3 + 1 for p in range(w)] for r in range(w)]
    got = [sends[p][me] for p in range(w)]
    for alg in ["auto"] + kernels("all_to_all"):
        rows = [[torch.randn(sum(sends[r]), 3, generator=torch.Generator().manual_seed(
            40 + 10 * i + r)).to(torch.float16) for r in range(w)] for i in range(CALLS)]

        def all_to_all(i):
            out = _fresh(torch.empty(sum(got), 3, dtype=torch.float16), dev, keep)
            ctx.all_to_all(out, _fresh(rows[i][me], dev, keep), out_splits=got,
                           in_splits=sends[me], algorithm=alg)
            ctx.sync()
            want = torch.cat([rows[i][p][sum(sends[p][:me]):sum(sends[p][:me + 1])]
                              for p in range(w)])
            assert_equal(out, want, f"all_to_all {alg} call {i}")
        _builds_once(ctx, f"all_to_all {alg}", all_to_all)

    for alg in ["auto"] + kernels("broadcast"):
        xs = [rank_inputs(w, (301,), torch.int32, seed=50 + i) for i in range(CALLS)]

        def broadcast(i):
            t = _fresh(xs[i][me], dev, keep)
            ctx.broadcast(t, src=w - 1, algorithm=alg)
            ctx.sync()
            assert_equal(t, xs[i][w - 1], f"broadcast {alg} call {i}")
        _builds_once(ctx, f"broadcast {alg}", broadcast)
    return True


def test_every_collective_reuses_its_plan(pool):
    assert all(pool.run(_every_collective))


def _mixed_and_views(ctx):
    """A heap out with a plain input; a byte view one past a word boundary; overlapping
    plain tensors; a heap tensor's path (its own address key, as before)."""
    w, me, dev, keep = ctx.world_size, ctx.rank, ctx.device, []
    out = ctx.empty(9 * w, dtype=torch.float32)
    xs = [rank_inputs(w, (9,), torch.float32, seed=60 + i) for i in range(CALLS)]

    def heap_out(i):
        ctx.all_gather(out, _fresh(xs[i][me], dev, keep))
        ctx.sync()
        assert_equal(out, torch.cat(xs[i]), f"heap out, plain inp: call {i}")
    _builds_once(ctx, "heap out, plain inp", heap_out)

    # uint8 of 3 bytes a rank, one byte into a plain buffer: as_words copies it through an
    # aligned buffer of the plan's own, by the address modulo 16 in the key
    bs = [rank_inputs(w, (3,), torch.uint8, seed=70 + i) for i in range(CALLS)]

    def odd_bytes(i):
        base = _fresh(torch.zeros(64, dtype=torch.uint8), dev, keep)
        inp, got = base[1:4], _fresh(torch.zeros(64, dtype=torch.uint8), dev, keep)
        inp.copy_(bs[i][me])
        ctx.all_gather(got[1:1 + 3 * w], inp)
        ctx.sync()
        assert_equal(got[1:1 + 3 * w], torch.cat(bs[i]), f"odd bytes: call {i}")
        assert not got[0] and not got[1 + 3 * w:].any(), "wrote outside the view"
    _builds_once(ctx, "odd byte views", odd_bytes)

    # all_gather's input inside its output (rank me's block), at new addresses: the
    # address-keyed path, a plan per call, and right
    builds = ctx.plans.builds
    for i in range(2):
        big = _fresh(torch.zeros(9 * w), dev, keep)
        big[9 * me:9 * (me + 1)] = xs[i][me]
        ctx.all_gather(big, big[9 * me:9 * (me + 1)])
        ctx.sync()
        assert_equal(big, torch.cat(xs[i]), f"in-place all_gather {i}")
    assert ctx.plans.builds > builds + 1, "overlapping plain tensors took one plan"

    h = ctx.empty(37, dtype=torch.float32)
    builds = ctx.plans.builds
    for i in range(CALLS):
        h.copy_(xs[i][me][:1].expand(37) + i)
        ctx.all_reduce(h)
        ctx.sync()
        assert_equal(h, reduce_ref([x[:1].expand(37) + i for x in xs[i]], "sum"), "heap")
    key = ("all_reduce", tensor_key(h), "sum", "auto", None, None, (), False)
    assert key in ctx.plans and ctx.plans.builds == builds + 1 + (ctx.backend == "cuda")
    ctx.free(h)
    ctx.free(out)
    return True


def test_mixed_views_and_heap(pool):
    assert all(pool.run(_mixed_and_views))


def _keeps_nothing(ctx):
    """The plan of plain tensors holds none of them: each dies when the caller drops it
    (on the CPU emulation too, where an address-keyed plan's launches keep their
    arguments)."""
    dev, w, dead = ctx.device, ctx.world_size, []
    for i in range(3):
        t = torch.randn(100, device=dev)
        out, inp = torch.empty(w * 50, device=dev), torch.randn(50, device=dev)
        ctx.all_reduce(t, algorithm="two_shot")
        ctx.all_gather(out, inp, algorithm="pull")
        ctx.sync()
        refs = [weakref.ref(x) for x in (t, out, inp)]
        del t, out, inp
        gc.collect()
        dead.append([r() is None for r in refs])
    return dead


def test_plain_plans_keep_no_tensor(pool):
    for rank, dead in enumerate(pool.run(_keeps_nothing)):
        assert all(all(d) for d in dead), f"rank {rank}: kept alive: {dead}"


def _repeated_address(ctx):
    """GPUs: a staged algorithm (one that pulls from its peers' heaps, so a plain input is
    copied in first: all_reduce two_shot, all_gather pull) on plain tensors that stay at
    one address captures one CUDA graph of that address (Plan._by_address) and replays it,
    right as the contents change; tensors elsewhere run the steps, right too; the graph
    keeps no tensor."""
    w, me, dev = ctx.world_size, ctx.rank, ctx.device
    graphs = {}
    cases = {"two_shot": lambda: (torch.empty(111, device=dev),),
             "pull": lambda: (torch.empty(37 * w, device=dev), torch.empty(37, device=dev))}
    for alg, make in cases.items():
        def call(ts, seed):
            xs = rank_inputs(w, (ts[-1].numel(),), torch.float32, seed=seed)
            ts[-1].copy_(xs[me])
            if alg == "two_shot":
                ctx.all_reduce(ts[0], algorithm=alg)
                want = reduce_ref(xs, "sum")
            else:
                ctx.all_gather(ts[0], ts[1], algorithm=alg)
                want = torch.cat(xs)
            ctx.sync()
            assert_equal(ts[0], want, f"{alg}, seed {seed}")
        ts = make()
        for i in range(4):
            call(ts, 70 + i)
        call(make(), 80)                     # another address: the steps
        call(ts, 81)                         # back: its graph
        staged = [p for p in ctx.plans._plans.values()
                  if p.name == alg and p.plain and len(p.steps) > 1]
        graphs[alg] = [(len(p.at_graphs), p.captures) for p in staged]
        refs = [weakref.ref(t) for t in ts]
        del ts
        gc.collect()
        assert all(r() is None for r in refs), f"{alg}: the plan's graph keeps a tensor"
    return graphs


def test_a_repeated_plain_address_is_replayed_from_a_graph(pool):
    if pool.backend != "cuda":
        pytest.skip("CUDA graphs: GPUs only (tests/plans/test_plain_graphs.py checks the "
                    "bookkeeping on the CPU)")
    if pool.world_size == 1:
        pytest.skip("one rank: a collective is a copy (or nothing), so no plan has steps "
                    "to capture")
    for rank, graphs in enumerate(pool.run(_repeated_address)):
        for alg, found in graphs.items():
            assert (1, 1) in found, (rank, alg, found)
