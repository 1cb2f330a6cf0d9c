"""`trident demo`.

The demo starts one rank per visible GPU (or 4 CPU ranks without GPUs), then:
  1. a ring: every rank stores a random block into the next rank's heap and signals it;
     the next rank waits for the flag and checks the block (several rounds, no resets);
  2. an atomic counter: every rank adds rank+1 to a counter on every peer, many times;
     each counter must end at rounds * world*(world+1)/2;
  3. the library's ops on random data, each checked against plain torch on the gathered
     inputs: all_reduce, all_gather, matmul_all_reduce, and MoE dispatch + combine;
and prints what it checked and how long each part took.
"""
from __future__ import annotations

import time

import torch
import triton
import triton.language as tl

import trident.language as tdl
from trident.runtime.errors import OP_CODES
from trident.tools.testing import dot_magnitude, mismatch, rounding_bound

_DEMO_OP = tl.constexpr(OP_CODES["test"])


@triton.jit
def _ring_kernel(src, dst, flag, ctrl, rank, world_size, heap_bases, n, round_no,
                 BLOCK: tl.constexpr):
    nxt = (rank + 1) % world_size
    prv = (rank + world_size - 1) % world_size
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tdl.put(dst + offs, src + offs, rank, nxt, heap_bases, mask=offs < n)
    tdl.signal(flag, round_no, rank, nxt, heap_bases)
    tdl.wait(flag, round_no, ctrl, rank, prv, _DEMO_OP)


@triton.jit
def _counter_kernel(counter, rank, world_size, heap_bases, rounds):
    for _ in range(rounds):
        for peer in range(world_size):
            tdl.atomic_add(counter, rank + 1, rank, peer, heap_bases, sem="relaxed")


def _demo_rank(ctx, n: int, rounds: int, adds: int):
    out = {}
    src = ctx.empty(n, dtype=torch.float32)
    dst = ctx.zeros(n, dtype=torch.float32)
    flag = ctx.zeros(1, dtype=torch.int64)
    counter = ctx.zeros(1, dtype=torch.int64)
    ctx.barrier()
    prv = (ctx.rank - 1) % ctx.world_size
    t0 = time.perf_counter()
    for r in range(1, rounds + 1):
        values = torch.randn(n, generator=torch.Generator().manual_seed(r * 97 + ctx.rank))
        src.copy_(values)
        _ring_kernel[(1,)](src, dst, flag, ctx.ctrl, ctx.rank, ctx.world_size, ctx.heap_bases,
                           n, r, BLOCK=1024 if ctx.backend == "cuda" else 256)
        expect = torch.randn(n, generator=torch.Generator().manual_seed(r * 97 + prv))
        ctx.sync()
        if not torch.equal(dst.cpu(), expect):
            raise RuntimeError(f"rank {ctx.rank}: ring round {r} got wrong data from rank {prv}")
        ctx.barrier()     # the previous rank may overwrite dst in the next round
    out["ring_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    _counter_kernel[(1,)](counter, ctx.rank, ctx.world_size, ctx.heap_bases, adds)
    ctx.barrier()
    out["counter_s"] = time.perf_counter() - t0
    expect = adds * ctx.world_size * (ctx.world_size + 1) // 2
    if counter.item() != expect:
        raise RuntimeError(f"rank {ctx.rank}: atomic counter is {counter.item()}, expected {expect}")
    out["counter"] = counter.item()
    return out


def _gathered(ctx, t):
    parts = [torch.empty_like(t) for _ in range(ctx.world_size)]
    torch.distributed.all_gather(parts, t.contiguous(), group=ctx.group)
    return parts


def _check(ctx, what: str, got: torch.Tensor, ref: torch.Tensor, bound) -> None:
    """`got` (bfloat16) against the fp32 reference `ref`, each element within `bound` (built
    from the magnitudes summed into it, trident/tools/testing.py) and within 2e-2 relative error
    over the tensor, which a missing, doubled or misplaced part exceeds."""
    problem = mismatch(got, ref, bound)
    if problem is not None:
        raise RuntimeError(f"rank {ctx.rank}: {what} differs from torch on the gathered "
                           f"inputs: {problem}")


def _check_sum(ctx, what: str, got: torch.Tensor, parts: list[torch.Tensor]) -> None:
    """`got` against the fp32 sum of `parts`. Every bf16 rounding on the way -- of a part,
    of a partial sum (NCCL sums in bf16), of the result -- moves a value by at most one
    bf16 unit of the magnitude summed so far: (parts + 1) roundings of sum |part|."""
    ref = sum(p.float().cpu() for p in parts)
    _check(ctx, what, got, ref,
           rounding_bound(sum(p.float().abs().cpu() for p in parts), len(parts) + 1))


def _check_matmul_sum(ctx, what: str, got: torch.Tensor, a_parts, w_parts) -> None:
    """`got` against sum_r a_r @ w_r.T in fp32: the roundings of the partials and their
    sums as in _check_sum, plus the fp32 accumulation of K products in the result and in
    the reference, which errs with sum_k |a_ik||w_jk| (near-zero elements, whose products
    cancel, err as much as large ones)."""
    partials = [a.float().cpu() @ w.float().cpu().T for a, w in zip(a_parts, w_parts)]
    k = sum(a.shape[1] for a in a_parts)
    bound = (rounding_bound(sum(p.abs() for p in partials), len(partials) + 1)
             + rounding_bound(sum(dot_magnitude(a, w) for a, w in zip(a_parts, w_parts)),
                              2 * k, torch.float32))
    _check(ctx, what, got, sum(partials), bound)


def _timed(ctx, fn):
    t0 = time.perf_counter()
    out = fn()
    ctx.sync()
    return out, time.perf_counter() - t0


def _ops_rank(ctx, gpu: bool):
    """Each op on random data against plain torch; returns {op: seconds} (first call, so
    compilation is included)."""
    from ..moe import ExpertParallel
    dev, bf16, g = ctx.device, torch.bfloat16, torch.Generator().manual_seed(7 + ctx.rank)
    times = {}
    x = torch.randn(1 << 20 if gpu else 3000, generator=g).to(bf16).to(dev)
    y, times["all_reduce"] = _timed(ctx, lambda: ctx.all_reduce(x.clone()))
    _check_sum(ctx, "all_reduce", y, _gathered(ctx, x))
    out = torch.empty(ctx.world_size * x.numel(), dtype=bf16, device=dev)
    _, times["all_gather"] = _timed(ctx, lambda: ctx.all_gather(out, x))
    _check(ctx, "all_gather", out, torch.cat(_gathered(ctx, x)).float(), 0.0)    # exact
    m, n, k = (512, 1024, 512) if gpu else (64, 40, 24)
    a = torch.randn(m, k, generator=g).to(bf16).to(dev)
    w = torch.randn(n, k, generator=g).to(bf16).to(dev)
    y, times["matmul_all_reduce"] = _timed(ctx, lambda: ctx.matmul_all_reduce(a, w))
    _check_matmul_sum(ctx, "matmul_all_reduce", y, _gathered(ctx, a), _gathered(ctx, w))
    experts, topk, hidden, max_tokens = 2 * ctx.world_size, 2, (2048 if gpu else 64), 32
    ep = ExpertParallel(ctx, experts, topk, hidden, max_tokens)
    tokens = int(torch.randint(0, max_tokens + 1, (1,), generator=g))
    xt = torch.randn(tokens, hidden, generator=g).to(bf16).to(dev)
    idx = torch.stack([torch.randperm(experts, generator=g)[:topk] for _ in range(tokens)]) \
        if tokens else torch.empty(0, topk, dtype=torch.int64)
    wts = torch.rand(tokens, topk, generator=g)
    idx, wts = idx.to(dev), wts.to(dev)

    def moe():
        d = ep.dispatch(xt, idx)
        scale = torch.arange(ep.num_local_experts, device=dev) + 1 + ctx.rank * ep.num_local_experts
        return ep.combine(d.expert_x * scale.view(-1, 1, 1).to(bf16), d, wts)
    yt, times["moe dispatch+combine"] = _timed(ctx, moe)
    # expert e scales its rows by e+1; token t's result sums its topk weighted rows
    _check_sum(ctx, "moe dispatch+combine", yt,
               [wts[:, k:k + 1] * (idx[:, k:k + 1] + 1) * xt.float() for k in range(topk)])
    return times


def demo(world_size: int | None = None) -> int:
    from trident.runtime.launch import RankPool
    t0 = time.perf_counter()
    with RankPool(world_size, heap_size=64 << 20) as pool:
        start_s = time.perf_counter() - t0
        gpu = pool.backend == "cuda"
        n, rounds, adds = (1 << 20, 20, 1000) if gpu else (2048, 5, 50)
        w = pool.world_size
        print(f"trident demo: {w} rank{'s' if w > 1 else ''} on "
              f"{('GPUs' if w > 1 else 'a GPU') if gpu else 'the CPU emulation (no GPU visible)'}"
              f", started in {start_s:.1f} s")
        if w == 1:
            print("  (one rank is its own neighbour and only peer, and every collective a copy "
                  "or nothing; --world-size 2 runs two ranks, on one GPU too)")
        results = pool.run(_demo_rank, n, rounds, adds)
        op_times = pool.run(_ops_rank, gpu)
    print(f"  ring: {rounds} rounds of {n} float32 stored into the next rank + signal/wait, "
          f"checked on every rank: ok ({max(r['ring_s'] for r in results) * 1e3:.1f} ms, "
          f"host checks included)")
    print(f"  atomics: {w} rank{'s' if w > 1 else ''} x {adds} rounds of atomic_add(rank+1) "
          f"on every peer; each counter = {results[0]['counter']} as expected: ok "
          f"({max(r['counter_s'] for r in results) * 1e3:.1f} ms)")
    for op in op_times[0]:
        print(f"  {op}: random data on every rank, matches torch on the gathered inputs: ok "
              f"({max(t[op] for t in op_times) * 1e3:.1f} ms, first call: compilation included)")
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0

