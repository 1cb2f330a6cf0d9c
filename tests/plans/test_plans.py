"""Launch plans (trident/runtime/plans.py): reused for the same signature, rebuilt for a new one,
dropped on reset, free and close; right when a tensor's contents change in place."""
import random
from collections import OrderedDict

import pytest
import torch

from trident.runtime.plans import Plan, PlanCache

from ..ccl.refs import assert_equal, place, rank_inputs, reduce_ref


def _reuse_and_rebuild(ctx):
    plans = ctx.plans
    on_gpu = ctx.backend == "cuda"     # an eager build also builds the capture's twin
    n = 300
    xs = rank_inputs(ctx.world_size, (n,), torch.float32, seed=1)
    keep = []
    for alg, sym in (("one_shot", False), ("two_shot", False), ("two_shot", True)):
        t = place(ctx, xs[ctx.rank], sym)
        builds = plans.builds
        for i in range(3):
            # new contents at the same address, every call: the plan reads them afresh
            t.copy_(xs[ctx.rank] * (i + 1))
            ctx.all_reduce(t, algorithm=alg)
            ctx.sync()
            assert_equal(t, reduce_ref(xs, "sum") * (i + 1), f"{alg} sym={sym} call {i}")
        assert plans.builds == builds + 1 + on_gpu, "one build per signature"
        hits = plans.hits
        ctx.all_reduce(t[: n // 2], algorithm=alg)       # new shape: a new plan
        assert plans.builds == builds + 2 * (1 + on_gpu) and plans.hits == hits
        # new dtype and address (kept alive: a freed tensor's address may come back, and a
        # tensor of the same shape there rightly reuses the plan). The copy is plain: the
        # last case's is of the signature of the one before (two_shot, fp16, 300), whose
        # plan it reuses at its new address (ccl._plain_key)
        keep.append(t.to(torch.float16))
        ctx.all_reduce(keep[-1], algorithm=alg)
        assert plans.builds == builds + (3 - sym) * (1 + on_gpu)
    ctx.sync()

    # all_gather through pull (input staged when not on the heap) and push
    blocks = rank_inputs(ctx.world_size, (5, 3), torch.bfloat16, seed=2)
    out = torch.empty(5 * ctx.world_size, 3, dtype=torch.bfloat16, device=ctx.device)
    inp = blocks[ctx.rank].clone().to(ctx.device)
    for alg in ("pull", "push"):
        for i in range(2):
            inp.copy_(blocks[ctx.rank] + i)
            ctx.all_gather(out, inp, algorithm=alg)
            ctx.sync()
            assert_equal(out, torch.cat([b + i for b in blocks]), f"all_gather {alg} call {i}")


def test_reuse_and_rebuild(pool):
    pool.run(_reuse_and_rebuild)


def _dropped(ctx):
    t = ctx.zeros(64)
    ctx.all_reduce(t)
    assert len(ctx.plans) >= 1
    ctx.reset()
    assert len(ctx.plans) == 0, "reset drops every plan"
    ctx.all_reduce(t)
    assert len(ctx.plans) >= 1
    ctx.free(t)
    assert len(ctx.plans) == 0, "free drops plans (they may point into the block)"
    u = ctx.ones(64)                  # same offset as t: the new plan must be built afresh
    builds = ctx.plans.builds
    ctx.all_reduce(u)
    ctx.sync()
    assert ctx.plans.builds == builds + 1 + (ctx.backend == "cuda")
    assert_equal(u, torch.full((64,), float(ctx.world_size)), "after free")
    with ctx.trace(None, capacity=64):
        assert len(ctx.plans) == 0, "a trace session starts with no plans"
        ctx.all_reduce(u)
    assert len(ctx.plans) == 0, "and ends with none"
    ctx.free(u)


def test_dropped_on_reset_free_trace(pool):
    pool.run(_dropped)


def _fused_fresh_outputs(ctx):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(4, 32, generator=g).to(torch.bfloat16).to(ctx.device)
    w = torch.randn(24, 32, generator=g).to(torch.bfloat16).to(ctx.device)
    first = ctx.matmul_all_reduce(a, w, algorithm="fused")
    second = ctx.matmul_all_reduce(a, w, algorithm="fused")
    ctx.sync()
    assert first.data_ptr() != second.data_ptr(), "a fresh output per call"
    assert torch.equal(first, second)
    # the same a on every rank: the sum is world * a @ w.T
    ref = (a.float() @ w.float().T) * ctx.world_size
    torch.testing.assert_close(first.float().cpu(), ref.cpu(), rtol=2e-2, atol=2e-1)


def test_fused_op_fresh_outputs(pool):
    pool.run(_fused_fresh_outputs)


def test_cache_is_bounded_lru():
    cache = PlanCache(capacity=2)
    for key in "abc":
        cache.put(key, Plan())
    assert len(cache) == 2 and cache.get("a") is None
    cache.get("b")
    cache.put("d", Plan())
    assert cache.get("b") is not None and cache.get("c") is None, "least recently used goes"


def test_cache_evicts_exactly_the_least_recently_used():
    """A hit only stamps its plan and the order is rebuilt when one must go (PlanCache):
    against an OrderedDict moved to the end at every hit, over random gets and puts."""
    rng = random.Random(3)
    for capacity in (1, 2, 3, 8):
        cache, ref = PlanCache(capacity=capacity), OrderedDict()
        for _ in range(3000):
            key = rng.randrange(3 * capacity)
            if rng.random() < 0.6:
                plan = cache.get(key)
                assert (plan is None) == (key not in ref), (capacity, key)
                if key in ref:
                    assert plan is ref[key]
                    ref.move_to_end(key)
            elif key not in cache:
                ref[key] = cache.put(key, Plan())
                if len(ref) > capacity:
                    ref.popitem(last=False)
            assert cache.order() == list(ref), capacity


def _bad_input_after_a_plan(ctx):
    t = torch.zeros(8, device=ctx.device)
    ctx.all_reduce(t)
    with pytest.raises(TypeError, match="torch.Tensor"):
        ctx.all_reduce([1.0, 2.0])
    with pytest.raises(ValueError, match="contiguous"):
        ctx.all_reduce(torch.zeros(8, 2, device=ctx.device).t())


def test_bad_input_still_raises_after_a_plan(pool):
    pool.run(_bad_input_after_a_plan)


class _FakeGraph:
    """What plans._capture returns on GPUs, recorded: the steps it was given and each
    replay (a replay runs them, as a CUDA graph's would)."""

    def __init__(self, steps, tensors):
        self.steps, self.tensors, self.replays = steps, tensors, 0

    def replay(self):
        self.replays += 1
        for step in self.steps:
            step(self.tensors)


def test_a_plan_becomes_a_graph_on_its_second_run(monkeypatch):
    """A graphable plan of several steps runs its steps at its first run and is captured
    at its second (with that run's tensors), then replayed; a key used once -- a plain
    tensor at a new address every call -- never pays a capture. Never captured while the
    stream is being captured; a kept reference to the first `run` replays the graph."""
    import trident.runtime.plans as plans
    captured, capturing = [], [False]

    def fake_capture(steps, tensors):
        captured.append(_FakeGraph(steps, tensors))
        return captured[-1]
    monkeypatch.setattr(plans, "_capture", fake_capture)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    ran = []
    plan = Plan()
    plan.add(lambda ts: ran.append(("copy in", ts)))
    plan.add(lambda ts: ran.append(("kernel", ts)))
    plan.finish("multi")
    first_run = plan.run
    plan.run(("a",))
    assert not captured and ran == [("copy in", ("a",)), ("kernel", ("a",))]
    capturing[0] = True                 # the caller's own capture: the steps go into it
    plan.run(("a",))
    assert not captured and len(ran) == 4
    capturing[0] = False
    plan.run(("a",))
    assert len(captured) == 1 and captured[0].tensors == ("a",) and captured[0].replays == 1
    plan.run(("a",))
    first_run(("a",))
    assert captured[0].replays == 3 and len(captured) == 1 and len(ran) == 10

    single = Plan()                     # one step ("multi"): never a graph
    single.add(lambda ts: ran.append("one"))
    single.finish("multi")
    for _ in range(3):
        single.run(())
    off = Plan()                        # graphs off (the CPU emulation): never a graph
    off.add(lambda ts: None)
    off.add(lambda ts: None)
    off.finish("off")
    for _ in range(3):
        off.run(())
    assert len(captured) == 1 and single.graph is None and off.graph is None
