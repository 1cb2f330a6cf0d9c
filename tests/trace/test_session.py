"""ctx.trace end to end on the ranks: a traced ring exchange, its JSON, its summary,
dropped events, errors. On GPUs also: a known in-kernel delay shows up as such."""
import json
import statistics

import numpy as np
import pytest
import torch
import torch.distributed as dist
import triton
import triton.language as tl

import trident.language as tdl
from trident.trace import device as trd
from trident.trace import kernel_args, tags
from trident.tools.ring import BLOCK, ring_exchange

from .chrome_format import check_nesting, check_trace_format

PROGRAMS, CALLS = 2, 2
EVENTS_PER_PROGRAM = 5          # kernel, wait (ack), send, wait (data), copy


def _traced_ring(ctx, path, capacity, calls):
    n = PROGRAMS * BLOCK - 100                           # last program's chunk is partial
    inp = torch.randn(n, generator=torch.Generator().manual_seed(ctx.rank)).to(ctx.device)
    out = torch.empty_like(inp)
    ring_exchange(ctx, out, inp)                         # untraced warm-up
    ctx.barrier()
    with ctx.trace(path, capacity=capacity, print_summary=False) as session:
        for _ in range(calls):
            ring_exchange(ctx, out, inp)
    assert kernel_args(ctx)[1] is False                  # off again after the block
    everyone = [torch.empty_like(inp) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, inp, group=ctx.group)
    torch.testing.assert_close(out, everyone[(ctx.rank - 1) % ctx.world_size], rtol=0, atol=0)
    return session.events, session.dropped, session.summary


_runs: dict = {}


def _ring_trace(pool, tmp_path_factory):
    """One traced run per world size, shared by the tests that read it."""
    if pool.world_size not in _runs:
        path = tmp_path_factory.mktemp("trace") / "ring.json"
        events, dropped, summary = pool.run(_traced_ring, str(path), 1024, CALLS)[0]
        _runs[pool.world_size] = (json.loads(path.read_text()), events, dropped, summary)
    return _runs[pool.world_size]


def test_json_follows_the_trace_event_format(pool, tmp_path_factory):
    doc, events, dropped, _ = _ring_trace(pool, tmp_path_factory)
    xs = check_trace_format(doc)
    assert len(xs) == sum(len(e) for e in events) == pool.world_size * CALLS * PROGRAMS * \
        EVENTS_PER_PROGRAM
    assert dropped == [0] * pool.world_size
    assert {x["name"] for x in xs} == {"kernel", "wait", "send", "copy"}


def test_events_nest_per_thread(pool, tmp_path_factory):
    doc, events, _, _ = _ring_trace(pool, tmp_path_factory)
    xs = check_trace_format(doc)
    check_nesting(xs)
    # and on one thread every phase lies inside that call's "kernel" slice
    for x in xs:
        if x["name"] != "kernel":
            assert any(k["pid"] == x["pid"] and k["tid"] == x["tid"] and
                       k["ts"] <= x["ts"] and x["ts"] + x["dur"] <= k["ts"] + k["dur"] + 1e-6
                       for k in xs if k["name"] == "kernel")


def test_ranks_are_merged(pool, tmp_path_factory):
    doc, events, _, _ = _ring_trace(pool, tmp_path_factory)
    xs = check_trace_format(doc)
    ranks = range(pool.world_size)
    assert {x["pid"] for x in xs} == set(ranks)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in ranks}
    for r in ranks:
        assert {x["tid"] for x in xs if x["pid"] == r} == set(range(PROGRAMS))
        assert set((events[r][:, 3] >> 32).tolist()) == {r}      # the rank the kernel wrote
    assert min(x["ts"] for x in xs) < 0.001                       # aligned to the earliest


def test_summary_agrees_with_the_events(pool, tmp_path_factory):
    doc, _, _, summary = _ring_trace(pool, tmp_path_factory)
    xs = check_trace_format(doc)
    assert len(summary) == 4 * pool.world_size
    for row in summary:
        durs = [x["dur"] for x in xs if x["name"] == row["tag"] and x["pid"] == row["rank"]]
        assert row["count"] == len(durs)
        for key, ref in (("min_us", min(durs)), ("median_us", statistics.median(durs)),
                         ("max_us", max(durs)), ("total_us", sum(durs))):
            assert abs(row[key] - ref) < 1e-3 * max(1, len(durs)), (key, row, ref)


def test_full_buffer_drops_and_counts(pool):
    capacity = 7
    events, dropped, _ = pool.run(_traced_ring, None, capacity, CALLS)[0]
    total = CALLS * PROGRAMS * EVENTS_PER_PROGRAM
    assert [len(e) for e in events] == [capacity] * pool.world_size
    assert dropped == [total - capacity] * pool.world_size


def _misuse(ctx):
    for bad, exc in (({"capacity": 0}, ValueError), ({"capacity": 2.5}, TypeError),
                     ({"path": 3}, TypeError)):
        with pytest.raises(exc):
            ctx.trace(**bad)
    with ctx.trace(None, print_summary=False):
        with pytest.raises(RuntimeError, match="do not nest"):
            with ctx.trace(None):
                pass
    live = set(ctx.allocator.live_offsets())
    with pytest.raises(KeyError):                # an error inside the block propagates,
        with ctx.trace(None, print_summary=False):
            raise KeyError("boom")
    assert set(ctx.allocator.live_offsets()) == live   # and the buffer is given back
    assert kernel_args(ctx)[1] is False


def test_misuse_raises_clear_errors(pool):
    pool.run(_misuse)


@triton.jit
def _spin_kernel(trace_buf, ctrl, heap_bases, rank, world_size, delay_ns, TRACE: tl.constexpr):
    tdl.barrier(ctrl, rank, world_size, heap_bases)   # in-kernel: ranks leave it together
    t = trd.begin(TRACE)
    start = tdl.timestamp()
    now = start
    while now - start < delay_ns:
        now = tdl.timestamp()
    trd.end(trace_buf, t, tags.WAIT, rank, TRACE)


def _known_delay(ctx, delay_ns):
    scratch = torch.zeros(8 + 4, dtype=torch.int64, device=ctx.device)
    scratch[2] = 1                                    # capacity of one event
    _spin_kernel[(1,)](scratch, ctx.ctrl, ctx.heap_bases, ctx.rank, ctx.world_size, 1000,
                       TRACE=True)         # compile it first
    ctx.barrier()
    with ctx.trace(None, print_summary=False) as session:
        trace_buf, enabled = kernel_args(ctx)
        _spin_kernel[(1,)](trace_buf, ctx.ctrl, ctx.heap_bases, ctx.rank, ctx.world_size,
                           delay_ns, TRACE=enabled)
    return session.events


def test_known_delay_is_plausible(pool):
    gpu = pool.backend == "cuda"
    delay = 200_000 if gpu else 20_000_000
    events = pool.run(_known_delay, delay)[0]
    starts = [int(e[0, 0]) for e in events]
    for ev in events:
        assert len(ev) == 1
        dur = int(ev[0, 1] - ev[0, 0])
        # %globaltimer ticks in steps of up to 1 us; the loop exits within a few polls
        assert delay - 1_000 <= dur <= delay + (50_000 if gpu else 2_000_000_000), dur
    # ranks share one clock: leaving the in-kernel barrier, they start within microseconds
    assert max(starts) - min(starts) < (5_000_000 if gpu else 3_000_000_000), starts


@pytest.mark.parametrize("n", [1, BLOCK, 3 * BLOCK + 5])
def test_ring_exchange_sizes(pool, n):
    pool.run(_ring_sizes, n)


def _ring_sizes(ctx, n):
    inp = torch.arange(n, dtype=torch.float32, device=ctx.device) * (ctx.rank + 1)
    out = torch.zeros_like(inp)
    ring_exchange(ctx, out, inp)
    ring_exchange(ctx, out, inp)                 # the epoch flags need no reset
    ctx.barrier()
    prev = (ctx.rank - 1) % ctx.world_size
    assert torch.equal(out, torch.arange(n, dtype=torch.float32, device=ctx.device) * (prev + 1))
    with pytest.raises(ValueError):
        ring_exchange(ctx, out[:-1] if n > 1 else out.double(), inp)
