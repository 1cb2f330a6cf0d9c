"""A collective that falls back to the inner group on one rank only (its dtype or reduction
is not one trident serves there; the others' is): the ranks meet before a fallback
(trident/torch/backend/fallback.py), so every rank raises CallMismatch naming the
fallback at once, every output is poisoned, and reset() repairs. Before, the last rank
waited in gloo's all_reduce and the others in trident's kernel, each to its timeout.
Ranks that fall back alike still get the inner group's right result."""
import datetime
import time

import pytest
import torch
import torch.distributed as dist

from trident.runtime.errors import CallMismatch, PeerFailed

LIMIT = 5.0        # seconds; the group's waits run out at 15


def _attempt(fn):
    t0 = time.perf_counter()
    try:
        fn()
        return None, "", time.perf_counter() - t0
    except Exception as exc:        # noqa: BLE001 -- the test inspects what came
        return type(exc).__name__, str(exc), time.perf_counter() - t0


def _one_sided(ctx, what):
    from trident.torch.backend import Options, context
    last, dev = ctx.world_size - 1, ctx.device
    g = dist.new_group(backend="trident", timeout=datetime.timedelta(seconds=15),
                       pg_options=Options(heap_size=8 << 20, timeout=15.0))
    sub = context(g)
    for dtype in (torch.float32, torch.float64):     # warm: compiled, plans, workspaces
        dist.all_reduce(torch.ones(64, dtype=dtype, device=dev), group=g)
    t = torch.ones(64, dtype=torch.float64, device=dev)
    dist.all_reduce(t, group=g)                      # every rank falls back: right
    alike = bool((t == ctx.world_size).all())
    if what == "dtype":
        t = torch.ones(64, dtype=torch.float64 if ctx.rank == last else torch.float32,
                       device=dev)
        op = dist.ReduceOp.SUM
    else:                                            # PRODUCT falls back, SUM does not
        t = torch.ones(64, device=dev)
        op = dist.ReduceOp.PRODUCT if ctx.rank == last else dist.ReduceOp.SUM
    call = _attempt(lambda: dist.all_reduce(t, op=op, group=g))
    poisoned = bool(t.isnan().all())
    after = _attempt(sub.sync) if call[0] is None else call
    sub.reset()
    t = torch.full((8,), float(ctx.rank + 1), device=dev)
    dist.all_reduce(t, group=g)
    repaired = t.cpu().tolist() == [ctx.world_size * (ctx.world_size + 1) / 2] * 8
    dist.destroy_process_group(g)
    return alike, call, poisoned, after, repaired


@pytest.mark.parametrize("what", ["dtype", "reduction"])
def test_a_fallback_on_one_rank_raises_on_every_rank_at_once(tpool, what):
    results = tpool.run(_one_sided, what)
    last = tpool.world_size - 1
    every = "\n".join(f"rank {r}: {x}" for r, x in enumerate(results))
    for rank, (alike, call, poisoned, after, repaired) in enumerate(results):
        assert alike, every
        assert poisoned, f"rank {rank}: the output is not poisoned\n{every}"
        kind, text, took = after
        if rank == last:     # the rank that falls back: its call itself raises
            assert call[0] == CallMismatch.__name__, every
        assert kind in (CallMismatch.__name__, PeerFailed.__name__), every
        assert "fallback with dist.all_reduce" in text, every
        assert call[2] + took < LIMIT, every
        assert repaired, every
