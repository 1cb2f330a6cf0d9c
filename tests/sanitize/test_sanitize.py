"""The race detector (TRIDENT_SANITIZE, trident/sanitize/): it reports a planted race,
and every shipped kernel runs clean under it at 2 and 3 ranks, small sizes.

The pool's rank processes are reused: each test switches the sanitizer on in them for
its own duration (`sanitizing(ctx, seed)`, collective) instead of starting ranks with
TRIDENT_SANITIZE=1 in their environment.
"""
import pytest
import torch

from trident import sanitize
from trident.runtime.launch import default_backend

from .. import algorithms
from .planted import run_push_all_gather, run_put_unordered

pytestmark = pytest.mark.skipif(default_backend() != "cpu",
                                reason="the sanitizer runs on the CPU emulation only")

SEEDS = (1, 2)


@pytest.fixture(params=[2, 3], ids=lambda w: f"world{w}")
def spool(request):
    from tests.conftest import get_pool
    return get_pool(request.param)


def _planted(ctx, wait, seed):
    inp = torch.arange(40, dtype=torch.float32) + 100 * ctx.rank
    with sanitize.sanitizing(ctx, seed):
        out = run_push_all_gather(ctx, inp, wait)
        try:
            ctx.barrier()
        except sanitize.RaceError as e:
            return str(e)
    want = torch.cat([torch.arange(40, dtype=torch.float32) + 100 * r
                      for r in range(ctx.world_size)])
    assert torch.equal(out, want)
    return None


@pytest.mark.parametrize("seed", SEEDS)
def test_planted_missing_wait_is_reported(spool, seed):
    """push all_gather with its wait for the peers' DATA signal removed: each rank reads
    its scratch slots while peers may still write them."""
    reports = spool.run(_planted, False, seed)
    for rank, msg in enumerate(reports):
        assert msg is not None, f"rank {rank} reported no race"
        assert "race" in msg and "push_all_gather" in msg and "heap of rank" in msg
        assert "write by rank" in msg and "read by rank" in msg


def test_planted_kernel_with_wait_is_clean(spool):
    assert spool.run(_planted, True, 3) == [None] * spool.world_size


def _plant(ctx, which):
    g = torch.Generator().manual_seed(ctx.rank)
    inp = torch.randn(40, generator=g)
    if which == "push_all_gather":           # every rank reads slots that peers write
        run_push_all_gather(ctx, inp, False)
    else:                                    # ranks 0 and 1 only; rank 2 touches nothing
        run_put_unordered(ctx, inp)


PLANTS = {"push_all_gather": "push_all_gather", "put_0_to_1": "put_unordered"}


def _race_at_sync(ctx, which):
    """What each rank's ctx.sync() and then ctx.barrier() raise (type, message)."""
    seen = []
    with sanitize.sanitizing(ctx, 5):
        _plant(ctx, which)
        for call in (ctx.sync, ctx.barrier):
            try:
                call()
                seen.append(None)
            except Exception as e:
                seen.append((type(e).__name__, str(e)))
    return seen


@pytest.mark.parametrize("which", list(PLANTS))
def test_race_raised_at_the_same_sync_on_every_rank(spool, which):
    """A race raises RaceError at ctx.sync() on every rank, also on a rank that made
    neither access (world 3, put_0_to_1); the barrier after it, where the program caught
    it, neither repeats it nor times out."""
    for rank, (at_sync, at_barrier) in enumerate(spool.run(_race_at_sync, which)):
        assert at_sync is not None and at_sync[0] == "RaceError", \
            f"rank {rank}'s ctx.sync() raised {at_sync}, not RaceError"
        msg = at_sync[1]
        assert "race" in msg and "at ctx.sync()" in msg and PLANTS[which] in msg
        assert "write by rank" in msg and "read by rank" in msg
        if which == "put_0_to_1":
            assert "heap of rank 1" in msg and "by rank 0" in msg and "by rank 1" in msg
        assert at_barrier is None, f"rank {rank}'s barrier after the race raised {at_barrier}"


def _race_uncaught(ctx):
    with sanitize.sanitizing(ctx, 6):
        _plant(ctx, "put_0_to_1")
        ctx.sync()
        ctx.barrier()


def test_uncaught_race_ends_every_rank_with_race_error(spool):
    """The program of the issue: no rank reaches the barrier (where a peer would wait
    until HostTimeout): every rank ends with RaceError, at once."""
    with pytest.raises(sanitize.RaceError) as info:
        spool.run(_race_uncaught)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    others = [line for line in notes.splitlines() if "failed too" in line]
    assert len(others) == spool.world_size - 1, notes
    assert all("RaceError" in line and "HostTimeout" not in line for line in others), notes


# ---------------------------------------------------------------- shipped kernels
def _ccl_clean(ctx, seed):
    """Every algorithm of every collective (tests/algorithms.py, family "sanitize"), each
    twice back to back (epochs, scratch halves); the Lamport kernels' buffers are exempt
    (value-synchronised), their flags are not."""
    w, r = ctx.world_size, ctx.rank
    g = torch.Generator().manual_seed(7)
    with sanitize.sanitizing(ctx, seed):
        for alg in algorithms.kernels("all_gather", "sanitize"):
            xs = [torch.randn(33, generator=g) for _ in range(w)]
            out = torch.empty(33 * w)
            for _ in range(2):
                ctx.all_gather(out, xs[r].clone(), algorithm=alg, block=16)
            ctx.barrier()
            torch.testing.assert_close(out, torch.cat(xs))
        for alg in algorithms.kernels("reduce_scatter", "sanitize"):
            big = [torch.randn(w * 20, generator=g) for _ in range(w)]
            rs = torch.empty(20)
            for _ in range(2):
                ctx.reduce_scatter(rs, big[r].clone(), algorithm=alg, block=16)
            ctx.barrier()
            torch.testing.assert_close(rs, sum(big)[r * 20:(r + 1) * 20])
        for alg in algorithms.kernels("all_reduce", "sanitize"):
            xs = [torch.randn(50, generator=g) for _ in range(w)]
            t = xs[r].clone()
            ctx.all_reduce(t, algorithm=alg, block=16)
            t2 = xs[r].clone()
            ctx.all_reduce(t2, algorithm=alg, block=16)
            ctx.barrier()
            torch.testing.assert_close(t, sum(xs))
        for alg in algorithms.kernels("all_to_all", "sanitize"):
            rows = [[(s + d) % 3 + 1 for d in range(w)] for s in range(w)]   # rows[s][d]
            ins = [torch.randn(sum(rows[s]), 4, generator=g) for s in range(w)]
            out = torch.empty(sum(rows[s][r] for s in range(w)), 4)
            for _ in range(2):
                ctx.all_to_all(out, ins[r].clone(), out_splits=[rows[s][r] for s in range(w)],
                               in_splits=rows[r], algorithm=alg)
            ctx.barrier()
            want = torch.cat([ins[s][sum(rows[s][:r]):sum(rows[s][:r + 1])] for s in range(w)])
            torch.testing.assert_close(out, want)
        for alg in algorithms.kernels("broadcast", "sanitize"):
            src = w - 1
            base = torch.randn(70, generator=g)
            for _ in range(2):
                t = base.clone() if r == src else torch.zeros(70)
                ctx.broadcast(t, src=src, algorithm=alg, block=16)
            ctx.barrier()
            torch.testing.assert_close(t, base)
    return True


def test_collectives_run_clean(spool):
    assert all(spool.run(_ccl_clean, 11))


def _ops_clean(ctx, seed):
    w, r = ctx.world_size, ctx.rank
    g = torch.Generator().manual_seed(3)
    h = torch.float16

    def close(got, want):
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    with sanitize.sanitizing(ctx, seed):
        a = [torch.randn(4, 16, generator=g).to(h) for _ in range(w)]
        wt = torch.randn(8, 16, generator=g).to(h)
        a2 = [torch.randn(4 * w, 16, generator=g).to(h) for _ in range(w)]
        full = sum(x.float() @ wt.float().T for x in a2)
        # each of trident's schedules (tests/algorithms.py); the newer ones twice back to
        # back (epochs, scratch halves, the gathered rows' reuse), "fused" once
        for schedule in algorithms.schedules("sanitize"):
            calls = 1 if schedule == "fused" else 2
            for _ in range(calls):
                y = ctx.all_gather_matmul(a[r].clone(), wt, schedule=schedule)
            ctx.barrier()
            close(y, torch.cat(a).float() @ wt.float().T)
            for _ in range(calls):
                y2 = ctx.matmul_reduce_scatter(a2[r].clone(), wt, schedule=schedule)
            ctx.barrier()
            close(y2, full[4 * r:4 * (r + 1)])
            for _ in range(calls):
                y3 = ctx.matmul_all_reduce(a2[r].clone(), wt, schedule=schedule)
            ctx.barrier()
            close(y3, full)
    return True


def test_fused_ops_run_clean(spool):
    assert all(spool.run(_ops_clean, 12))


def _moe_clean(ctx, seed):
    import trident as td
    w, r = ctx.world_size, ctx.rank
    E, k, H, T = 2 * w, 2, 16, 5
    g = torch.Generator().manual_seed(100 + r)
    with sanitize.sanitizing(ctx, seed):
        ep = td.ExpertParallel(ctx, E, k, H, max_num_tokens=8, dtype=torch.float16)
        for split in (False, True):
            x = torch.randn(T, H, generator=g).to(torch.float16)
            idx = torch.rand(T, E, generator=g).argsort(dim=1)[:, :k]
            wts = torch.rand(T, k, generator=g)
            d = ep.dispatch(x, idx, wait=not split)
            if split:
                d = d.wait()
            y = ep.combine(d.expert_x.clone(), d, wts)
            ctx.barrier()
            torch.testing.assert_close(y.float(), x.float() * wts.sum(1, keepdim=True),
                                       rtol=2e-2, atol=2e-2)
    return True


def test_moe_runs_clean(spool):
    assert all(spool.run(_moe_clean, 13))
