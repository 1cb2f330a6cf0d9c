"""A call that raised on one rank only (its input check), and the next call made at once
on every rank without ctx.reset(): the rank that raised must not pair its next call with
the one its peers are still in. It did: rank 0's all_reduce returned 1 + rank 1's next
value with no error, and rank 1's next call 1 + 20 where 10 + 20 was asked, silently
(context_sync.py `_meet_peers`). Now every rank raises at the next call, none returns
plausible data, and reset() makes the context right again; ranks that all make the same
mistake stay in step and need no reset."""
import torch

from .mismatch import attempt


def _attempt(fn) -> str:
    kind, text, _ = attempt(fn)
    return "ok" if kind == "no error" else f"{kind}: {text}"


def _lone_error_then_next_call(ctx):
    last = ctx.world_size - 1
    ctx.all_reduce(torch.ones(64, device=ctx.device))       # warm: plans and workspaces
    ctx.sync()
    a = torch.full((64,), 1.0, device=ctx.device)
    bad = torch.ones(64, dtype=torch.float64, device=ctx.device)
    first = _attempt(lambda: ctx.all_reduce(bad if ctx.rank == last else a))
    b = torch.full((64,), 10.0 * (ctx.rank + 1), device=ctx.device)
    second = _attempt(lambda: (ctx.all_reduce(b), ctx.sync()))
    got = (first, a[0].item(), second, b[0].item())
    ctx.reset()
    c = torch.full((64,), float(ctx.rank + 1), device=ctx.device)
    ctx.all_reduce(c)
    ctx.sync()
    # every rank makes the same mistake: in step, the next call is right without a reset
    same = _attempt(lambda: ctx.all_reduce(bad))
    d = torch.full((64,), float(ctx.rank + 1), device=ctx.device)
    ctx.all_reduce(d)
    ctx.sync()
    return got, c[0].item(), same, d[0].item()


def test_the_next_call_after_an_error_on_one_rank_raises_everywhere(pool):
    if pool.world_size == 1:
        return
    world = pool.world_size
    total = world * (world + 1) / 2
    results = pool.run(_lone_error_then_next_call)
    every = "\n".join(f"rank {r}: {x}" for r, x in enumerate(results))
    for rank, ((first, a0, second, b0), c0, same, d0) in enumerate(results):
        if rank == world - 1:
            assert first.startswith("TypeError") and "float64" in first, every
        else:        # the call its peer skipped: poisoned, never plausible data
            assert first != "ok" or a0 != a0, every
        assert second.startswith("PeerFailed"), every
        assert "call ctx.reset() on every rank" in second, every
        assert b0 != b0 or b0 == 10.0 * (rank + 1), every   # NaN, or not run at all
        assert c0 == total, every                            # reset: right again
        assert same.startswith("TypeError"), every
        assert d0 == total, every
