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
from trident.errors import OP_CODES

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


# How far one bfloat16 rounding can move a value, relative to its magnitude: one ulp,
# 2**-7 (round-to-nearest on GPUs errs by half that; the Triton interpreter truncates).
BF16_ULP = 2.0 ** -7


def _check_sum(ctx, what: str, got: torch.Tensor, parts: list[torch.Tensor]) -> None:
    """`got` (bfloat16) against the fp32 sum of `parts`, with a tolerance scaled to the
    operands. Every bf16 rounding on the way -- of a part, of a partial sum (NCCL sums in
    bf16), of the result -- errs by at most BF16_ULP times the magnitude summed so far, so
    each element is within (parts + 1) * BF16_ULP * sum |part| of the exact sum, however
    near 0 the sum itself is (parts of about 30 cancelling to about 0 are common in a
    GEMM). And the relative error over the whole tensor stays below 2e-2, which a missing,
    doubled or misplaced part exceeds."""
    got, ref = got.float().cpu(), sum(parts).cpu()
    if got.shape != ref.shape:
        raise RuntimeError(f"rank {ctx.rank}: {what} has shape {list(got.shape)}, expected "
                           f"{list(ref.shape)}")
    if not got.numel():
        return
    bound = (len(parts) + 1) * BF16_ULP * sum(p.abs() for p in parts).cpu() + 1e-6
    excess = ((got - ref).abs() / bound).max().item()
    rel = ((got - ref).norm() / ref.norm().clamp_min(1e-6)).item()
    if not torch.isfinite(got).all() or excess > 1 or rel > 2e-2:
        worst = ((got - ref).abs() / bound).argmax().item()
        raise RuntimeError(
            f"rank {ctx.rank}: {what} differs from torch on the gathered inputs: element "
            f"{worst} is {got.flatten()[worst].item():.4g}, expected "
            f"{ref.flatten()[worst].item():.4g} within {bound.flatten()[worst].item():.3g}; "
            f"relative error over the tensor {rel:.2e} (allowed 2e-2)")


def _timed(ctx, fn):
    t0 = time.perf_counter()
    out = fn()
    ctx.sync()
    return out, time.perf_counter() - t0


def _ops_rank(ctx, gpu: bool):
    """Each op on random data against plain torch; returns {op: seconds} (first call, so
    compilation is included)."""
    import trident as td
    dev, bf16, g = ctx.device, torch.bfloat16, torch.Generator().manual_seed(7 + ctx.rank)
    times = {}
    x = torch.randn(1 << 20 if gpu else 3000, generator=g).to(bf16).to(dev)
    y, times["all_reduce"] = _timed(ctx, lambda: ctx.all_reduce(x.clone()))
    _check_sum(ctx, "all_reduce", y, [p.float() for p in _gathered(ctx, x)])
    out = torch.empty(ctx.world_size * x.numel(), dtype=bf16, device=dev)
    _, times["all_gather"] = _timed(ctx, lambda: ctx.all_gather(out, x))
    assert torch.equal(out, torch.cat(_gathered(ctx, x)))
    m, n, k = (512, 1024, 512) if gpu else (64, 40, 24)
    a = torch.randn(m, k, generator=g).to(bf16).to(dev)
    w = torch.randn(n, k, generator=g).to(bf16).to(dev)
    y, times["matmul_all_reduce"] = _timed(ctx, lambda: ctx.matmul_all_reduce(a, w))
    _check_sum(ctx, "matmul_all_reduce", y, [ai.float() @ wi.float().T for ai, wi in
                                             zip(_gathered(ctx, a), _gathered(ctx, w))])
    experts, topk, hidden, max_tokens = 2 * ctx.world_size, 2, (2048 if gpu else 64), 32
    ep = td.ExpertParallel(ctx, experts, topk, hidden, max_tokens)
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
    from trident.launch import RankPool
    t0 = time.perf_counter()
    with RankPool(world_size, heap_size=64 << 20) as pool:
        start_s = time.perf_counter() - t0
        gpu = pool.backend == "cuda"
        n, rounds, adds = (1 << 20, 20, 1000) if gpu else (2048, 5, 50)
        print(f"trident demo: {pool.world_size} ranks on "
              f"{'GPUs' if gpu else 'the CPU emulation (no GPU visible)'}, "
              f"started in {start_s:.1f} s")
        results = pool.run(_demo_rank, n, rounds, adds)
        op_times = pool.run(_ops_rank, gpu)
    w = pool.world_size
    print(f"  ring: {rounds} rounds of {n} float32 stored into the next rank + signal/wait, "
          f"checked on every rank: ok ({max(r['ring_s'] for r in results) * 1e3:.1f} ms, "
          f"host checks included)")
    print(f"  atomics: {w} ranks x {adds} rounds of atomic_add(rank+1) on every peer; each "
          f"counter = {results[0]['counter']} as expected: ok "
          f"({max(r['counter_s'] for r in results) * 1e3:.1f} ms)")
    for op in op_times[0]:
        print(f"  {op}: random data on every rank, matches torch on the gathered inputs: ok "
              f"({max(t[op] for t in op_times) * 1e3:.1f} ms, first call: compilation included)")
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0

