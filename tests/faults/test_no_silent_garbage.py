"""A wrong call never yields plausible data (issue 29): every case below returned
believable numbers without an error before. Each checks that the output is poisoned (NaN),
that the next call raises at once on every rank, naming the cause, and that ctx.reset()
gives a context whose next correct call is right."""
import time

import pytest
import torch

import trident as td
from trident.runtime.errors import CallMismatch, CommTimeout, HeapMismatchError, PeerFailed

from .. import algorithms
from ..conftest import WORLD_SIZES
from .mismatch import MEET, assert_found_when_ranks_meet

MULTI = [w for w in WORLD_SIZES if w >= 2] or [2]
SHORT = 2.0          # seconds: the device timeout of the cases that time out on purpose


@pytest.fixture(params=MULTI, ids=lambda w: f"world{w}")
def pool(request):
    from ..conftest import get_pool
    return get_pool(request.param)


def _raises_at_once(call):
    """(exception type name, message, seconds) of `call()`, which must raise."""
    t0 = time.perf_counter()
    try:
        call()
    except Exception as exc:          # noqa: BLE001 -- the test inspects what came
        return type(exc).__name__, str(exc), time.perf_counter() - t0
    raise AssertionError("the call after a failed one did not raise")


def _then_reset_works(ctx):
    """After reset, a correct all_reduce is right (checked against the known sum)."""
    ctx.reset()
    x = torch.full((1000,), float(ctx.rank + 1), device=ctx.device)
    ctx.all_reduce(x)
    want = ctx.world_size * (ctx.world_size + 1) / 2
    assert torch.equal(x, torch.full_like(x, want)), x[:4]


def _sizes_differ(ctx, algorithm):
    """Case 3: rank 0 all-reduces 100 elements, the others 200 (plain tensors). "a|b": rank
    0 runs algorithm a, the others b (two protocols: Lamport's and the flags')."""
    names = algorithm.split("|")
    algorithm = names[-1] if ctx.rank else names[0]
    for n in (100, 200):      # compile both sizes' kernels first: a peer still compiling
        for name in names:    # would time out (and every rank makes every workspace)
            ctx.all_reduce(torch.ones(n, device=ctx.device), algorithm=name)
    ctx.sync()
    timeout = ctx.timeout_s
    ctx.set_timeout(MEET)
    try:
        t = torch.randn(100 if ctx.rank == 0 else 200, device=ctx.device)
        t0 = time.perf_counter()
        ctx.all_reduce(t, algorithm=algorithm)
        poisoned = bool(t.isnan().all())          # waits for the kernel
        call_s = time.perf_counter() - t0
        kind, text, took = _raises_at_once(lambda: ctx.all_reduce(torch.ones(8, device=ctx.device)))
        _then_reset_works(ctx)
        return poisoned, kind, text, took, call_s
    finally:
        ctx.set_timeout(timeout)


# every all_reduce of the registry, and rank 0 on lamport where the others run one_shot
@pytest.mark.parametrize("algorithm", algorithms.kernels("all_reduce") + ["lamport|one_shot"])
def test_sizes_that_differ_are_poisoned_and_raised(pool, algorithm):
    assert_found_when_ranks_meet(pool.run(_sizes_differ, algorithm), "all_reduce")


def _close_raises_the_pending_mismatch(ctx):
    """Issue 41 item 4: sizes that differ (plain tensors) in the last call before close():
    close() raises the mismatch on every rank, naming the call, and still frees the heap."""
    sub = td.init(heap_size=8 << 20, group=ctx.group, timeout=MEET)
    for n in (100, 200):        # compiled first, as in _sizes_differ
        sub.all_reduce(torch.ones(n, device=ctx.device))
    sub.sync()
    t = torch.randn(100 if ctx.rank == 0 else 200, device=ctx.device)
    sub.all_reduce(t)
    poisoned = bool(t.isnan().all())
    kind, text, took = _raises_at_once(sub.close)
    return poisoned, kind, text, took, sub._closed and sub._heap.local is None


def test_close_raises_a_pending_mismatch(pool):
    results = pool.run(_close_raises_the_pending_mismatch)
    for rank, (poisoned, kind, text, took, freed) in enumerate(results):
        assert poisoned, f"rank {rank}: the output of a mismatched call is not NaN"
        assert kind in (CallMismatch.__name__, PeerFailed.__name__), (rank, kind, text)
        assert f"rank {rank}: all_reduce" in text, text        # names the call that failed
        assert took < MEET / 2 and freed, (rank, took, freed)


def _wrong_device_on_one_rank(ctx):
    """Issue 41 item 1 as reported: rank 0 passes all_reduce a tensor of another device
    type, the others a right one; as a context's first call (the others create the op's
    workspaces: host exchanges that rank 0 never makes) and as a later call (the others'
    kernels wait for rank 0). Rank 0 raises ValueError, the others PeerFailed naming it,
    at once; then reset() on every rank and a correct call is right."""
    out = {}
    with td.init(heap_size=8 << 20, group=ctx.group, timeout=MEET) as sub:
        for when in ("first", "later"):
            t = torch.ones(64, device="meta" if sub.rank == 0 else sub.device)
            t0 = time.perf_counter()
            try:
                sub.all_reduce(t)
                sub.sync()
                got = ("no error", "")
            except Exception as exc:          # noqa: BLE001 -- the test inspects what came
                got = (type(exc).__name__, str(exc))
            took = time.perf_counter() - t0
            _then_reset_works(sub)
            out[when] = (*got, took, sub.rank == 0 or bool(t.isnan().all()))
    return out


def test_a_bad_input_on_one_rank_is_repaired_by_reset(pool):
    for rank, cases in enumerate(pool.run(_wrong_device_on_one_rank)):
        for when, (kind, text, took, poisoned) in cases.items():
            what = f"{when} call, rank {rank}: {kind} in {took:.2f} s: {text}"
            assert took < 5, what
            if rank == 0:
                assert kind == "ValueError" and "is on meta" in text, what
                continue
            assert kind == PeerFailed.__name__, what
            assert "rank 0" in text and "ValueError" in text and "all_reduce" in text, what
            # later: the kernel ran, and poisoned t; first: no kernel ran (t was not handed
            # back: the call raised)
            assert poisoned or when == "first", what


def _gather_sizes_differ(ctx, algorithm):
    for n in (33, 65):        # compiled first, as in _sizes_differ
        out = torch.zeros(n * ctx.world_size, dtype=torch.float16, device=ctx.device)
        ctx.all_gather(out, torch.ones(n, device=ctx.device).half(), algorithm=algorithm)
    ctx.sync()
    timeout = ctx.timeout_s
    ctx.set_timeout(MEET)
    try:
        n = 33 if ctx.rank == 0 else 65
        out = torch.zeros(n * ctx.world_size, dtype=torch.float16, device=ctx.device)
        ctx.all_gather(out, torch.randn(n, device=ctx.device).half(), algorithm=algorithm)
        poisoned = bool(out.isnan().any())
        kind, _, _ = _raises_at_once(lambda: ctx.barrier())
        _then_reset_works(ctx)
        return poisoned, kind
    finally:
        ctx.set_timeout(timeout)


@pytest.mark.parametrize("algorithm", algorithms.kernels("all_gather"))
def test_all_gather_sizes_that_differ(pool, algorithm):
    results = pool.run(_gather_sizes_differ, algorithm)
    for rank, (poisoned, kind) in enumerate(results):
        assert poisoned, f"rank {rank}: no poison in the output of a mismatched all_gather"
        assert kind in (CallMismatch.__name__, PeerFailed.__name__), results   # every rank's


def _broadcast_calls_differ(ctx, what):
    """broadcast lamport, rank 0's call unlike the others': another root (rank 0 names 1,
    the others 0: no rank is the root of its own call) or another size (33 elements where
    the others have 65, from the last rank). Every rank raises, its tensor poisoned unless
    it is the root of its own call (the root's tensor is its input)."""
    w, odd = ctx.world_size, ctx.rank == 0
    calls = {"root": [(65, 1), (65, 0)], "size": [(33, w - 1), (65, w - 1)]}[what]
    for n, src in calls:          # compiled first, as in _sizes_differ
        ctx.broadcast(torch.ones(n, device=ctx.device).half(), src=src % w, algorithm="lamport")
    ctx.sync()
    timeout = ctx.timeout_s
    ctx.set_timeout(MEET)
    try:
        n, src = calls[0] if odd else calls[1]
        t = torch.randn(n, device=ctx.device).half()
        ctx.broadcast(t, src=src, algorithm="lamport")
        poisoned = None if ctx.rank == src else bool(t.isnan().all())
        kind, text, _ = _raises_at_once(lambda: ctx.barrier())
        _then_reset_works(ctx)
        return poisoned, kind, text
    finally:
        ctx.set_timeout(timeout)


@pytest.mark.parametrize("what", ["root", "size"])
def test_broadcast_calls_that_differ(pool, what):
    results = pool.run(_broadcast_calls_differ, what)
    for rank, (poisoned, kind, text) in enumerate(results):
        assert poisoned is not False, f"rank {rank}: no poison in a mismatched broadcast"
        assert kind in (CallMismatch.__name__, PeerFailed.__name__), results   # every rank's
        assert "broadcast" in text and "different call" in text, results


def _one_rank_skips(ctx):
    """Case 2: every rank but the last all-reduces; its wait times out."""
    timeout = ctx.timeout_s
    ctx.set_timeout(SHORT)
    try:
        result = None
        if ctx.rank != ctx.world_size - 1:
            t = torch.ones(64, device=ctx.device)
            ctx.all_reduce(t)
            poisoned = bool(t.isnan().all())
            result = (poisoned, *_raises_at_once(
                lambda: ctx.all_reduce(torch.ones(8, device=ctx.device))))
        _then_reset_works(ctx)
        return result
    finally:
        ctx.set_timeout(timeout)


def test_a_timed_out_call_is_poisoned_and_the_next_call_raises(pool):
    results = pool.run(_one_rank_skips)
    for rank, result in enumerate(results[:-1]):
        poisoned, kind, text, took = result
        assert poisoned, f"rank {rank}: a timed-out all_reduce returned plausible data"
        assert kind in (CommTimeout.__name__, PeerFailed.__name__), (rank, kind, text)
        assert "all_reduce" in text, text        # names the op that timed out
        assert took < 0.5, f"rank {rank}: the next call took {took:.2f} s to raise"


def last_rank_skips(ctx, call, missing=lambda out: out):
    """Case 2 for an op `call()` runs: every rank runs it once (compiled: a peer still
    compiling would pass for a missing one), then every rank but the last again, with the
    device timeout SHORT, and the next call. Returns, there, (whether missing(its output)
    -- what needed the last rank -- is all NaN, *_raises_at_once(call)); None on the last
    rank. Every rank resets after (_then_reset_works)."""
    call()
    ctx.sync()
    timeout = ctx.timeout_s
    ctx.set_timeout(SHORT)
    try:
        result = None
        if ctx.rank != ctx.world_size - 1:
            lost = missing(call()).float()              # waits for the missing rank
            result = (bool(lost.isnan().all()), *_raises_at_once(call))
        _then_reset_works(ctx)
        return result
    finally:
        ctx.set_timeout(timeout)


def check_last_rank_skipped(results, op: str, what: str) -> None:
    """last_rank_skips' results: every rank but the last saw `what` poisoned, then its
    next call raised at once, CommTimeout or PeerFailed naming `op`."""
    for rank, (poisoned, kind, text, took) in enumerate(results[:-1]):
        assert poisoned, f"rank {rank}: {what} not NaN ({op})"
        assert kind in (CommTimeout.__name__, PeerFailed.__name__), (rank, kind, text)
        assert op in text, text                       # names the op that timed out
        assert took < 0.5, f"rank {rank}: the next call took {took:.2f} s to raise"


def _gather_peer_never_pushes(ctx, gemm):
    """Case 2 for the fused all_gather_matmul: its last rank skips a call (so never pushes
    its rows). On every other rank the tiles of those rows are poisoned (the tiles of rows
    that came before the wait gave up may be right) and the next call raises at once."""
    def call():
        a = torch.ones(8, 32, dtype=torch.bfloat16, device=ctx.device)
        w = torch.ones(24, 32, dtype=torch.bfloat16, device=ctx.device)
        return ctx.all_gather_matmul(a, w, schedule="fused", gemm=gemm)

    return last_rank_skips(ctx, call, lambda out: out[-8:])     # the last rank's rows


@pytest.mark.parametrize("gemm", ["tma", "gluon"])
def test_a_gather_whose_peer_never_pushes_is_poisoned(pool, gemm):
    """The fused all_gather_matmul on the "tma" core and on the "gluon" one (its Gluon
    kernel on sm_90 GPUs, the "tma" core on the CPU emulation)."""
    check_last_rank_skipped(pool.run(_gather_peer_never_pushes, gemm), "all_gather_matmul",
                            f"the missing peer's rows ({gemm})")


def _heap_differs_then_reset(ctx):
    """Case 2 as reported: a heap mismatch, reset, then a correct call. The heaps are
    compared at host collectives (a barrier, a workspace's creation), so the barrier finds
    it wherever the all_reduce's workspaces exist already (on GPUs they do)."""
    x = ctx.ones(1 << 8 if ctx.rank == 0 else 1 << 10)      # blocks of different sizes
    with pytest.raises(HeapMismatchError):
        ctx.barrier()
    # the heaps still differ: reset says so at once, and so does every call after it
    with pytest.raises(HeapMismatchError, match="free the tensors"):
        ctx.reset()
    with pytest.raises(HeapMismatchError):
        ctx.all_reduce(torch.ones(64, device=ctx.device))
    ctx.free(x)
    _then_reset_works(ctx)
    return True


def test_reset_after_a_heap_mismatch(pool):
    assert all(pool.run(_heap_differs_then_reset))


def _bad_input_on_one_rank(ctx):
    """Case 5 without debug mode: the last rank passes an int16 tensor (a TypeError at its
    plan's build); the others are already waiting for it in the kernel (or, in an op's
    first call, in its workspace's host exchange)."""
    timeout = ctx.timeout_s
    ctx.set_timeout(30.0)        # a peer that waited this long would fail the test
    try:
        bad = ctx.rank == ctx.world_size - 1
        t = torch.ones(64, dtype=torch.int16 if bad else torch.float32, device=ctx.device)
        t0 = time.perf_counter()
        try:
            ctx.all_reduce(t)
            if not bad:
                ctx.sync()
            outcome = ("no error", "")
        except Exception as exc:          # noqa: BLE001
            outcome = (type(exc).__name__, str(exc))
        took = time.perf_counter() - t0
        _then_reset_works(ctx)
        return (*outcome, took, bool(t.isnan().all()) if not bad else None)
    finally:
        ctx.set_timeout(timeout)


def test_an_error_on_one_rank_stops_the_others_at_once(pool):
    results = pool.run(_bad_input_on_one_rank)
    last = len(results) - 1
    assert results[last][0] == "TypeError", results[last]
    for rank, (kind, text, took, poisoned) in enumerate(results[:-1]):
        assert took < 10, f"rank {rank} waited {took:.1f} s for a peer that had failed"
        assert kind == PeerFailed.__name__, (rank, kind, text)
        assert f"rank {last}" in text and "TypeError" in text, text   # names rank and cause
        # on GPUs the good ranks' first call may create a staging workspace (a host
        # exchange, which the bad rank's failure ends: nothing launched, nothing returned)
        assert poisoned or "creates the workspace" in text, \
            f"rank {rank}: plausible data from a call whose peer failed"


def _bad_expert_id_debug(ctx):
    """Case 5 as reported: debug mode, a bad expert id on one rank's dispatch."""
    ctx.debug = True
    try:
        ep = td.ExpertParallel(ctx, num_experts=2 * ctx.world_size, experts_per_token=2,
                               hidden_dim=32, max_num_tokens=8, dtype=torch.float32)
        idx = torch.arange(8, device=ctx.device).view(4, 2) % (2 * ctx.world_size)
        if ctx.rank == ctx.world_size - 1:
            idx[2, 1] = 99
        try:
            ep.dispatch(torch.randn(4, 32, device=ctx.device), idx)
            return "no error"
        except ValueError as exc:
            return str(exc)
    finally:
        ctx.debug = False
        ctx.reset()


def test_a_bad_expert_id_is_raised_on_every_rank_in_debug_mode(pool):
    last = pool.world_size - 1
    for rank, text in enumerate(pool.run(_bad_expert_id_debug)):
        assert "is not an expert id" in text and f"on rank {last}" in text, (rank, text)
