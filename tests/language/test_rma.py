"""Remote loads, stores, get/put and atomics between every pair of ranks."""
import torch
import triton
import triton.language as tl

import trident.language as tdl


@triton.jit
def _scatter_kernel(src, dst, rank, world_size, heap_bases, n, BLOCK: tl.constexpr):
    """Every rank stores its block into slot [rank] of every peer's dst (push),
    then pulls slot [rank] of every peer's src into its own dst2 region (get)."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(src + offs, mask=mask)
    for peer in range(world_size):
        tdl.store(dst + rank * n + offs, x, rank, peer, heap_bases, mask=mask)


@triton.jit
def _pull_kernel(src, dst, rank, world_size, heap_bases, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    for peer in range(world_size):
        if peer % 2 == 0:
            tdl.get(dst + peer * n + offs, src + offs, rank, peer, heap_bases, mask=mask)
        else:
            x = tdl.load(src + offs, rank, peer, heap_bases, mask=mask)
            tl.store(dst + peer * n + offs, x, mask=mask)


@triton.jit
def _put_kernel(src, dst, rank, world_size, heap_bases, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    for peer in range(world_size):
        tdl.put(dst + rank * n + offs, src + offs, rank, peer, heap_bases, mask=mask)


def _every_pair(ctx, n, dtype):
    g = torch.Generator().manual_seed(1234)
    inputs = [torch.randn(n, generator=g).to(dtype) for _ in range(ctx.world_size)]
    src = ctx.empty(n, dtype=dtype)
    src.copy_(inputs[ctx.rank])
    expected = torch.cat(inputs).to(ctx.device)
    grid = (triton.cdiv(n, 128),)
    for kernel in (_scatter_kernel, _pull_kernel, _put_kernel):
        dst = ctx.empty(ctx.world_size * n, dtype=dtype)
        dst.fill_(-7)
        ctx.barrier()
        kernel[grid](src, dst, ctx.rank, ctx.world_size, ctx.heap_bases, n, BLOCK=128)
        ctx.barrier()
        assert torch.equal(dst, expected), kernel
        ctx.free(dst)


def test_every_rank_reaches_every_peer(pool):
    for n, dtype in ((1000, torch.float32), (129, torch.bfloat16), (1, torch.int8)):
        pool.run(_every_pair, n, dtype)


@triton.jit
def _atomics_kernel(counters, values, rank, world_size, heap_bases):
    """counters: [7] int32 per rank. Each rank applies each atomic once to every peer."""
    v = tl.load(values + rank)
    for peer in range(world_size):
        tdl.atomic_add(counters + 0, v, rank, peer, heap_bases)
        tdl.atomic_max(counters + 1, v, rank, peer, heap_bases)
        tdl.atomic_min(counters + 2, v, rank, peer, heap_bases)
        tdl.atomic_or(counters + 3, 1 << rank, rank, peer, heap_bases)
        tdl.atomic_and(counters + 4, ~(1 << rank), rank, peer, heap_bases)
        tdl.atomic_xor(counters + 5, v, rank, peer, heap_bases)
        # cas: only the rank that finds the initial value wins; count the wins
        won = tdl.atomic_cas(counters + 6, -1, rank, rank, peer, heap_bases) == -1
        tdl.atomic_add(counters + 7, won.to(tl.int32), rank, peer, heap_bases, sem="relaxed",
                       scope="sys")
        tdl.atomic_xchg(counters + 8, v, rank, peer, heap_bases)


def _atomics(ctx, seed):
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(1, 1 << 20, (ctx.world_size,), generator=g, dtype=torch.int32)
    counters = ctx.empty(9, dtype=torch.int32)
    counters.copy_(torch.tensor([0, -(1 << 30), 1 << 30, 0, -1, 0, -1, 0, 0], dtype=torch.int32))
    ctx.barrier()
    _atomics_kernel[(1,)](counters, values.to(ctx.device), ctx.rank, ctx.world_size, ctx.heap_bases)
    ctx.barrier()
    c = counters.cpu()
    xor = 0
    for v in values.tolist():
        xor ^= v
    all_bits = (1 << ctx.world_size) - 1
    assert c[0] == values.sum() and c[1] == values.max() and c[2] == values.min()
    assert c[3] == all_bits and c[4] == ~all_bits and c[5] == xor
    assert 0 <= c[6] < ctx.world_size and c[7] == 1
    assert c[8].item() in values.tolist()


def test_remote_atomics_exact(pool):
    for seed in range(3):
        pool.run(_atomics, seed)
