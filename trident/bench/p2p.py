"""`trident bench p2p`: push and pull bandwidth from one GPU to all its peers.

Every rank moves `--size` bytes to (push) or from (pull) each of its peers at the same
time, with a persistent grid of G programs and 16-byte accesses; the figure is bytes
leaving (push) or entering (pull) one GPU per second, the max time over ranks. Beside it:
the same traffic through the copy engines (torch copy_ into peer mappings) and the NVLink
floor. On the CPU emulation the numbers only show that the path works; where ranks share
a GPU (2 ranks on a one-GPU machine by default) the traffic stays in one GPU's HBM, and
the output says so.
"""
from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl

import trident.language as tdl
from trident.bench import common
from trident.ccl.nccl import host_device


@triton.jit
def _p2p_kernel(src, dst, rank, world_size, heap_bases, n_blocks,
                PUSH: tl.constexpr, BLOCK: tl.constexpr):
    """Block i goes to (or comes from) peer rank+1+(i % (world-1)); programs stride over i.
    dst holds one slot of n_blocks*BLOCK elements per source rank."""
    pid = tl.program_id(0)
    n_peers = world_size - 1
    slot = n_blocks * BLOCK
    for i in range(pid, n_blocks * n_peers, tl.num_programs(0)):
        peer = (rank + 1 + i % n_peers) % world_size
        offs = (i // n_peers) * BLOCK + tl.arange(0, BLOCK)
        offs = tl.max_contiguous(tl.multiple_of(offs, BLOCK), BLOCK)
        if PUSH:
            tdl.put(dst + rank * slot + offs, src + offs, rank, peer, heap_bases)
        else:
            tdl.get(dst + peer * slot + offs, src + offs, rank, peer, heap_bases)


def _run(ctx, size: int, grids: list[int], iters: int):
    block = 4096 if ctx.backend == "cuda" else 64              # int32 elements
    n = max(size // 4 // block, 1) * block
    src = ctx.randn(n, dtype=torch.float32).view(torch.int32)
    dst = ctx.zeros(ctx.world_size * n, dtype=torch.int32)
    n_blocks = n // block
    moved = (ctx.world_size - 1) * n * 4
    floor = common.nvlink_floor_us(moved)
    rows = []
    todo = [(d, g) for d in ("push", "pull") for g in grids]
    bar = common.Progress(len(todo) + 1, "p2p", enabled=ctx.rank == 0)
    for direction, grid in todo:
        def step(direction=direction, grid=grid):
            _p2p_kernel[(grid,)](src, dst, ctx.rank, ctx.world_size, ctx.heap_bases, n_blocks,
                                 PUSH=direction == "push", BLOCK=block, num_warps=8)
        us = common.time_us(ctx, step, warmup=3, iters=iters)
        rows.append({"impl": f"trident {direction}", "grid": grid, "bytes_per_peer": n * 4,
                     "us": us, "GBps": moved / us / 1e3, "floor_us": floor})
        bar.step(f"{direction} grid {grid}")
    # correctness of what was just timed: slot r of every rank's dst holds rank r's src
    ctx.barrier()
    host = host_device(ctx)                # the CPU under a gloo group of GPU ranks
    got = [dst[r * n:(r + 1) * n].to(host) for r in range(ctx.world_size)]
    everyone = [torch.empty_like(src, device=host) for _ in range(ctx.world_size)]
    torch.distributed.all_gather(everyone, src.to(host), group=ctx.group)
    for r in range(ctx.world_size):
        if r != ctx.rank and not torch.equal(got[r], everyone[r]):
            raise RuntimeError(f"rank {ctx.rank}: p2p data from rank {r} is wrong")
    if ctx.backend == "cuda":
        mine = dst[ctx.rank * n:(ctx.rank + 1) * n]
        peers = [ctx.peer_view(p, mine) for p in range(ctx.world_size) if p != ctx.rank]

        def copy_engines():
            for view in peers:
                view.copy_(src, non_blocking=True)
        us = common.time_us(ctx, copy_engines, warmup=3, iters=iters)
        rows.append({"impl": "copy engines (torch copy_ to peers)", "grid": None,
                     "bytes_per_peer": n * 4, "us": us, "GBps": moved / us / 1e3, "floor_us": floor})
    bar.step("copy engines")
    ctx.free(dst)
    ctx.free(src)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="trident bench p2p", description=__doc__)
    parser.add_argument("--size", type=int, default=None, help="bytes per peer (default 256 MiB on GPUs)")
    parser.add_argument("--grids", default=None, help="comma-separated program counts")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--world-size", type=int, default=None)
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args(argv)
    from trident.runtime.launch import default_backend, launch
    backend = default_backend()
    gpu = backend == "cuda"
    size = args.size or ((256 << 20) if gpu else (16 << 10))
    grids = [int(g) for g in args.grids.split(",")] if args.grids else \
        ([16, 32, 64, 132, 264, 528] if gpu else [1, 4])
    heap = max(1 << 30, size * 6) if gpu else 64 << 20
    iters = args.iters or (20 if gpu else 2)
    world = args.world_size or common.default_world(backend, cpu=4)
    results = launch(_bench_rank, world, size, grids, iters, args.out_dir, heap_size=heap)
    rows, path, headline = results[0]
    if headline:
        print(headline)
    common.print_table(rows, ["impl", "grid", "bytes_per_peer", "us", "GBps", "floor_us"])
    print(f"results: {path}")
    return 0


def _bench_rank(ctx, size, grids, iters, out_dir):
    rows = _run(ctx, size, grids, iters)
    path = common.write_results(ctx, "p2p", rows, {"note": "GBps = bytes leaving (push) or "
                                "entering (pull) one GPU per second, all peers at once"},
                                out_dir=out_dir)
    return rows, path, common.headline(ctx)


if __name__ == "__main__":
    sys.exit(main())
