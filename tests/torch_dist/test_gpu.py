"""GPU-only semantics of backend "trident" (skipped on the CPU emulation, whose kernels run
when they are called): calls on two streams, back to back, run in call order (the backend
orders a stream after the previous call's: trident's epochs need one order), async_op's
Work orders the stream that waits, and calls captured into a CUDA graph replay right."""
import pytest
import torch
import torch.distributed as dist

from .conftest import BACKEND

pytestmark = pytest.mark.skipif(BACKEND != "cuda", reason="GPU semantics: streams, CUDA graphs")


def _two_streams(ctx):
    w, dev = ctx.world_size, ctx.device
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    ts = [torch.full((4096 + i,), float(ctx.rank + i), device=dev) for i in range(12)]
    torch.cuda.synchronize()
    for i, t in enumerate(ts):                  # alternate streams, no waits of our own
        with torch.cuda.stream(streams[i % 2]):
            dist.all_reduce(t)
    torch.cuda.synchronize()
    for i, t in enumerate(ts):
        want = sum(r + i for r in range(w))
        assert torch.equal(t, torch.full_like(t, float(want))), (i, t[:4])
    # async_op: the Work makes the stream that waits (not the one that called) wait
    x = torch.full((1 << 16,), 1.0, device=dev)
    with torch.cuda.stream(streams[0]):
        work = dist.all_reduce(x, async_op=True)
    with torch.cuda.stream(streams[1]):
        work.wait()
        y = x * 2
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full_like(y, 2.0 * w))
    return True


def _graph(ctx):
    """Eager calls (twice: the second by all_reduce's shortcut), then two captures of the
    same calls (the second capture's all_reduce by the shortcut of captured plans), both
    replayed, then eager calls again (the eager shortcut): right every time."""
    w, dev = ctx.world_size, ctx.device
    t = torch.zeros(1000, device=dev)
    out = torch.empty(w * 1000, device=dev)
    t.fill_(1.0)
    for _ in range(2):                          # eager first: plans, workspaces
        dist.all_reduce(t)
        dist.all_gather_into_tensor(out, t)
    torch.cuda.synchronize()
    graphs = [torch.cuda.CUDAGraph() for _ in range(2)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    for graph in graphs:
        with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
            dist.all_reduce(t)
            dist.all_gather_into_tensor(out, t)
    torch.cuda.current_stream().wait_stream(side)
    for step in range(4):
        t.fill_(float(ctx.rank + step))
        if step < 3:
            graphs[step % 2].replay()
        else:
            dist.all_reduce(t)
            dist.all_gather_into_tensor(out, t)
        torch.cuda.synchronize()
        want = float(sum(r + step for r in range(w)))
        assert torch.equal(t, torch.full_like(t, want)), (step, t[:4])
        assert torch.equal(out, torch.full_like(out, want)), (step, out[:4])
    return True


def test_two_streams_in_call_order(tpool):
    assert all(tpool.run(_two_streams))


def test_cuda_graph_capture(tpool):
    assert all(tpool.run(_graph))
