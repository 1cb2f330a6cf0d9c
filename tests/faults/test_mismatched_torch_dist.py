"""Ranks that make a new call with different sizes, where the call hands its tensors to
torch.distributed (ccl's "nccl" algorithm, the ops' "plain" schedule). Before, nothing
compared the ranks' sizes there: gloo aborted the rank processes (SIGABRT: "Received data
size doesn't match expected size"), and NCCL waits without bound for bytes that never come.
Now the first build of each such call agrees on its sizes (ctx.agree_once, one host
exchange through the store): every rank raises ValueError naming both ranks' sizes, quickly,
before any rank reaches torch.distributed, and the next call with equal sizes is right.

Where ranks share a GPU the group is gloo and these paths are refused (their own
ValueError): skipped there."""
import time

import pytest
import torch

from ..conftest import WORLD_SIZES, get_pool

WORLDS = [w for w in WORLD_SIZES if w in (2, 3)] or [2]
QUICK = 5.0          # seconds within which every rank must have raised
CASES = ("all_reduce", "all_gather", "broadcast", "matmul_all_reduce")


@pytest.fixture(params=WORLDS, ids=lambda w: f"world{w}")
def pool(request):
    return get_pool(request.param)


def _call(ctx, case: str, n: int) -> torch.Tensor:
    """One call of `case` with n (the size that differs) on this rank; returns its output."""
    dev, g = ctx.device, torch.Generator().manual_seed(7)
    if case == "all_reduce":
        t = torch.full((n,), float(ctx.rank + 1), device=dev)
        ctx.all_reduce(t, algorithm="nccl")
        return t
    if case == "all_gather":
        out = torch.zeros(n * ctx.world_size, device=dev)
        ctx.all_gather(out, torch.full((n,), float(ctx.rank), device=dev), algorithm="nccl")
        return out
    if case == "broadcast":
        t = torch.full((n,), float(ctx.rank + 5), device=dev)
        ctx.broadcast(t, src=0, algorithm="nccl")
        return t
    a = torch.randn(n, 40, generator=g).to(dev, torch.bfloat16)
    w = torch.randn(24, 40, generator=g).to(dev, torch.bfloat16)
    return ctx.matmul_all_reduce(a, w, schedule="plain")


def _expected(ctx, case: str, n: int) -> torch.Tensor:
    """What _call returns with the same n on every rank (every rank's input known here)."""
    w = ctx.world_size
    if case == "all_reduce":
        return torch.full((n,), float(w * (w + 1) // 2))
    if case == "all_gather":
        return torch.arange(w, dtype=torch.float32).repeat_interleave(n)
    if case == "broadcast":
        return torch.full((n,), 5.0)
    g = torch.Generator().manual_seed(7)
    a = torch.randn(n, 40, generator=g).to(torch.bfloat16).float()
    wt = torch.randn(24, 40, generator=g).to(torch.bfloat16).float()
    return (a @ wt.t()) * w


def _mismatch(ctx):
    if not ctx.nccl_available:
        return None
    out = {}
    for case in CASES:
        n = 8 + 4 * ctx.rank                     # every rank a size of its own
        t0 = time.monotonic()
        try:
            _call(ctx, case, n)
            ctx.sync()
            raised = None
        except Exception as exc:                 # noqa: BLE001
            raised = f"{type(exc).__name__}: {exc}"
        took = time.monotonic() - t0
        ctx.sync()
        after = _call(ctx, case, 12).float().cpu()
        ctx.sync()
        tol = 0.05 if case == "matmul_all_reduce" else 0.0
        ok = torch.allclose(after, _expected(ctx, case, 12), rtol=tol, atol=tol)
        out[case] = dict(raised=raised, took=took, after_ok=ok)
    return out


def test_a_new_call_with_other_sizes_raises_on_every_rank(pool):
    results = pool.run(_mismatch)
    if results[0] is None:
        pytest.skip("ranks share a GPU: the torch.distributed paths are refused here")
    bad = []
    for rank, cases in enumerate(results):
        for case, r in cases.items():
            raised = r["raised"] or "nothing"
            if not raised.startswith("ValueError") or "every rank must pass the same" \
                    not in raised:
                bad.append(f"{case}, rank {rank}: raised {raised[:200]}")
            elif f"rank {rank} called with" not in raised:
                bad.append(f"{case}, rank {rank}: does not name its own sizes: {raised[:200]}")
            if r["took"] > QUICK:
                bad.append(f"{case}, rank {rank}: took {r['took']:.2f} s to raise")
            if not r["after_ok"]:
                bad.append(f"{case}, rank {rank}: the next call with equal sizes is wrong")
    assert not bad, "\n".join(bad)
