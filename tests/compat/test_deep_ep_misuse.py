"""DeepEP's normal mode and Buffer misused: every rank raises a clear error, quickly, and
the next correct call is right (checked against a reference built from every rank's
inputs in plain Python).

- combine (or a cached dispatch) with another dtype or hidden size on one rank: the
  staging buffers grew on that rank alone (a barrier its peers never made), or a dtype of
  the same width was read as the other one (garbage, no error). Now the rows' fields are
  agreed the first time a Buffer sees them (one published host exchange; a set lookup
  after): ValueError naming each rank's fields, or, where the peers' fields were agreed
  before, CallMismatch naming the new ones and the last agreed.
- num_tokens_per_expert: another length on one rank was a HeapMismatchError about the
  layout's buffers; a wrong dtype, or counts that do not match the routing, were taken.
- a Buffer used after destroy(), a group that is not one, num_nvl_bytes beyond the heap.
"""
import time

import pytest
import torch

from trident.compat import deep_ep

from ..faults.mismatch import attempt

H, K, T = 64, 2, 5
QUICK = 5.0            # seconds within which every rank must have raised
TIMEOUT = 10.0         # the context's waits meanwhile


def _inputs(rank: int, E: int):
    """Rank `rank`'s x [T, H] bf16 and topk_idx [T, K] (distinct experts, some -1)."""
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    idx[0, 1] = -1
    return x, idx


def _ranks_of(idx, L):
    return [sorted({e // L for e in row if e >= 0}) for row in idx.tolist()]


class _Round:
    """One Buffer's correct dispatch and combine on this rank, and their reference."""

    def __init__(self, ctx, buf):
        self.ctx, self.buf, R = ctx, buf, ctx.world_size
        self.E, self.L = 2 * R, 2
        self.x, self.idx = (t.to(ctx.device) for t in _inputs(ctx.rank, self.E))
        self.w = torch.full((T, K), 0.5, device=ctx.device)
        self.per_rank, _, self.per_expert, self.in_rank, _ = buf.get_dispatch_layout(
            self.idx, self.E)

    def layout(self, **change):
        return dict(dict(num_tokens_per_rank=self.per_rank, is_token_in_rank=self.in_rank,
                         num_tokens_per_expert=self.per_expert), **change)

    def dispatch(self, topk=True, **change):
        top = dict(topk_idx=self.idx, topk_weights=self.w) if topk else {}
        return self.buf.dispatch(self.x, **self.layout(**change), **top)

    def check(self) -> None:
        """A correct dispatch (counts per local expert) and combine, against plain Python."""
        R, me, L = self.ctx.world_size, self.ctx.rank, self.L
        recv, _, _, counts, handle, _ = self.dispatch()
        want = [sum(int((_inputs(s, self.E)[1] == me * L + j).sum()) for s in range(R))
                for j in range(L)]
        assert counts == want, (counts, want)
        out, _, _ = self.buf.combine(recv, handle)
        times = torch.tensor([[len(r)] for r in _ranks_of(self.idx.cpu(), L)], dtype=torch.float32)
        ref = (self.x.float().cpu() * times).to(torch.bfloat16)
        assert torch.equal(out.cpu(), ref)


def _fault(ctx, fn, reset: bool) -> tuple:
    """attempt(fn) with the context's waits at TIMEOUT, then ctx.reset() if `reset` (not
    where every rank raised ValueError at the same point: they are in step)."""
    old = ctx.timeout_s
    ctx.set_timeout(TIMEOUT)
    try:
        got = attempt(lambda: (fn(), ctx.sync()))
        if reset:
            ctx.reset()
        return got
    finally:
        ctx.set_timeout(old)


def _bad_rows(ctx, case):
    """The last rank passes combine (or a cached dispatch) rows of another dtype or hidden
    size: at the Buffer's first combine (`first`) or after one with the right rows."""
    buf = deep_ep.Buffer(ctx.group, 1 << 20)
    try:
        r = _Round(ctx, buf)
        recv, _, _, _, handle, _ = r.dispatch()
        bad = ctx.rank == ctx.world_size - 1
        if case != "first":
            buf.combine(recv, handle)                     # agreed and warm
            buf.dispatch(r.x, handle=handle)
        change = {"first": lambda t: t.half(), "dtype": lambda t: t.half(),
                  "hidden": lambda t: torch.cat([t, t], 1),
                  "cached": lambda t: t.half()}[case]
        if case == "cached":
            got = _fault(ctx, lambda: buf.dispatch(change(r.x) if bad else r.x, handle=handle),
                         reset=True)
        else:
            got = _fault(ctx, lambda: buf.combine(change(recv) if bad else recv, handle),
                         reset=case != "first")
        r.check()
        return got
    finally:
        buf.destroy()


@pytest.mark.parametrize("case", ["first", "dtype", "hidden", "cached"])
def test_rows_that_differ_on_one_rank_raise_on_every_rank(pool2, case):
    results = pool2.run(_bad_rows, case)
    every = "\n".join(f"rank {r}: {x}" for r, x in enumerate(results))
    last = len(results) - 1
    op = "dispatch" if case == "cached" else "combine"
    bad = {"hidden": f"x bfloat16 [n, {2 * H}]"}.get(case, f"x float16 [n, {H}]")
    for kind, text, took in results:
        assert took < QUICK, every
        # first: both ranks in the agreement; else the peers were in the kernel already
        assert kind == ("ValueError" if case == "first" else "CallMismatch"), every
        assert f"deep_ep {op}" in text or f"{op}: the ranks passed different" in text, every
        assert bad in text and f"x bfloat16 [n, {H}]" in text, every
        if case == "first":
            assert f"rank {last}: {bad}" in text and f"rank 0: x bfloat16" in text, every


def _bad_per_expert(ctx, case):
    """The last rank's num_tokens_per_expert is of another length, dtype, or not its
    routing (its counts + 1); or every rank's is too short for its routing (no top-k)."""
    buf = deep_ep.Buffer(ctx.group, 1 << 20)
    try:
        r = _Round(ctx, buf)
        bad = ctx.rank == ctx.world_size - 1
        pe = r.per_expert
        if case == "short":
            got = _fault(ctx, lambda: r.dispatch(topk=False,
                                                 num_tokens_per_expert=pe[:ctx.world_size]),
                         reset=False)
        else:
            wrong = {"length": torch.cat([pe, pe]), "dtype": pe.float(), "values": pe + 1}[case]
            got = _fault(ctx, lambda: r.dispatch(num_tokens_per_expert=wrong if bad else pe),
                         reset=case == "dtype")
        r.check()
        return got
    finally:
        buf.destroy()


@pytest.mark.parametrize("case", ["length", "dtype", "values", "short"])
def test_a_wrong_num_tokens_per_expert_raises_on_every_rank(pool2, case):
    results = pool2.run(_bad_per_expert, case)
    every = "\n".join(f"rank {r}: {x}" for r, x in enumerate(results))
    last = len(results) - 1
    R = len(results)
    for rank, (kind, text, took) in enumerate(results):
        assert took < QUICK, every
        assert "num_tokens_per_expert" in text, every
        if case == "dtype":      # refused on that rank: the peers stop at once naming it
            assert kind == ("ValueError" if rank == last else "PeerFailed"), every
            assert "int32" in text and "float32" in text, every
            continue
        assert kind == "ValueError", every
        if case == "length":
            assert f"rank 0: num_tokens_per_expert [{2 * R}]" in text, every
            assert f"rank {last}: num_tokens_per_expert [{4 * R}]" in text, every
        elif case == "values":
            assert f"rank {last}'s num_tokens_per_expert does not match" in text, every
            assert "expected each expert's number of entries in topk_idx" in text, every
        else:
            assert "does not match its routing" in text, every


def _destroyed(ctx):
    buf = deep_ep.Buffer(ctx.group, 1 << 20)
    r = _Round(ctx, buf)
    recv, _, _, _, handle, _ = r.dispatch()
    buf.destroy()
    buf.destroy()                      # again: nothing
    calls = {"get_dispatch_layout": lambda: buf.get_dispatch_layout(r.idx, r.E),
             "dispatch": r.dispatch,
             "combine": lambda: buf.combine(recv, handle),
             "low_latency_dispatch": lambda: buf.low_latency_dispatch(r.x, r.idx, T, r.E),
             "get_next_low_latency_combine_buffer":
                 lambda: buf.get_next_low_latency_combine_buffer(handle)}
    got = {name: attempt(call) for name, call in calls.items()}
    fresh = deep_ep.Buffer(ctx.group, 1 << 20)
    try:
        _Round(ctx, fresh).check()
    finally:
        fresh.destroy()
    return got


def test_a_destroyed_buffer_says_so(pool2):
    for rank, got in enumerate(pool2.run(_destroyed)):
        for name, (kind, text, took) in got.items():
            assert kind == "RuntimeError" and text.startswith("Buffer destroyed") \
                and name in text, f"rank {rank}, {name}: {kind}: {text}"


def _bad_buffer_args(ctx):
    got = {"str": attempt(lambda: deep_ep.Buffer("group")),
           "huge": attempt(lambda: deep_ep.Buffer(ctx.group, 1 << 50)),
           # more than the context's heap is DeepEP's reservation, not an error (trident
           # sizes per call): a DeepEP program's usual 1e9 must work on a smaller heap
           "heap+1": attempt(lambda: deep_ep.Buffer(ctx.group, ctx.heap_size - 8, 9,
                                                    low_latency_mode=True).destroy())}
    t0 = time.perf_counter()
    on_ctx = deep_ep.Buffer(ctx)               # a trident Context is taken as the group
    try:
        assert on_ctx.ctx is ctx and on_ctx.group is ctx.group
        _Round(ctx, on_ctx).check()
    finally:
        on_ctx.destroy()
    return got, time.perf_counter() - t0


def test_bad_buffer_arguments_are_refused(pool2):
    for rank, (got, _) in enumerate(pool2.run(_bad_buffer_args)):
        kind, text, _ = got["str"]
        assert kind == "TypeError" and "ProcessGroup" in text and "trident Context" in text \
            and "str" in text, (rank, got)
        kind, text, _ = got["huge"]
        assert kind == "ValueError" and "num_nvl_bytes + num_rdma_bytes" in text \
            and "device" in text and str(1 << 50) in text, (rank, got)
        assert got["heap+1"][0] == "no error", (rank, got)
