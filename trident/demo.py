"""`trident demo` and `trident info`.

The demo starts one rank per visible GPU (or 4 CPU ranks without GPUs), then:
  1. a ring: every rank stores a random block into the next rank's heap and signals it;
     the next rank waits for the flag and checks the block (several rounds, no resets);
  2. an atomic counter: every rank adds rank+1 to a counter on every peer, many times;
     each counter must end at rounds * world*(world+1)/2;
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
    w = pool.world_size
    print(f"  ring: {rounds} rounds of {n} float32 stored into the next rank + signal/wait, "
          f"checked on every rank: ok ({max(r['ring_s'] for r in results) * 1e3:.1f} ms, "
          f"host checks included)")
    print(f"  atomics: {w} ranks x {adds} rounds of atomic_add(rank+1) on every peer; each "
          f"counter = {results[0]['counter']} as expected: ok "
          f"({max(r['counter_s'] for r in results) * 1e3:.1f} ms)")
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


def info() -> int:
    import triton as _triton
    from trident import _env
    from trident.context import DEFAULT_HEAP_SIZE
    backend = "cpu (Triton interpreter)" if _env.INTERPRET else "cuda"
    print(f"trident backend: {backend}")
    print(f"torch {torch.__version__}, triton {_triton.__version__}")
    import os
    heap = int(os.environ.get("TRIDENT_HEAP_SIZE", DEFAULT_HEAP_SIZE))
    print(f"heap size per rank: {heap} B ({heap / 2**20:.0f} MiB; TRIDENT_HEAP_SIZE to change)")
    if not _env.INTERPRET and torch.cuda.is_available():
        n = torch.cuda.device_count()
        print(f"ranks: {n} (one per GPU)")
        for i in range(n):
            p = torch.cuda.get_device_properties(i)
            print(f"  GPU {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
        import subprocess
        try:
            topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                                  timeout=20).stdout
            print("NVLink topology (nvidia-smi topo -m):\n" + topo)
        except Exception as exc:
            print(f"NVLink topology: unavailable ({exc})")
    else:
        print("ranks: 4 CPU processes by default (trident demo --world-size N)")
    return 0
