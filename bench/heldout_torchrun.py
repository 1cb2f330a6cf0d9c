"""Issue 29, case 1: the fused ops' held-out cases under plain torchrun, ranks sharing GPUs.

    nvidia-cuda-mps-control -d        # the README's recipe; no per-rank cap exported
    torchrun --nproc-per-node 4 bench/heldout_torchrun.py

Runs the GPU MODE-style all_gather_matmul and matmul_reduce_scatter cases that came back
wrong (relative errors 0.12-0.86, no error) when ranks sharing one GPU had no MPS cap,
back to back, each checked against torch on the whole inputs: every rank rebuilds every
rank's inputs from their seeds, so the reference needs no collective. trident.init must
set each rank's cap before the CUDA driver initialises (`import trident` does,
trident/runtime/_env.py) or refuse. Prints, per rank, the SMs CUDA reports (under a cap in force
its share: 66 of an H100's 132 at 50 %, 32 at 25 %; the whole GPU means the cap holds
nothing), then one line per case, and exits 1 if any case is wrong on any rank.
"""
import os
import sys

import torch

import trident as td

# (op, M (all ranks' rows), N, K (all ranks' columns for matmul_reduce_scatter))
CASES = [("all_gather_matmul", 512, 36864, 4608), ("all_gather_matmul", 4096, 4096, 4096),
         ("all_gather_matmul", 64, 18432, 7168),
         ("matmul_reduce_scatter", 2048, 8192, 30720), ("matmul_reduce_scatter", 4096, 2880, 2880),
         ("matmul_reduce_scatter", 64, 7168, 18432)]


SCHEDULES = os.environ.get("HELDOUT_SCHEDULES", "fused,auto").split(",")
if os.environ.get("HELDOUT_TINY"):          # the CPU emulation: the same path, small shapes
    CASES = [(op, M // 32, N // 64, K // 64) for op, M, N, K in CASES]


def inputs(op, M, N, K, rank, world, device):
    """Rank `rank`'s (a, w), from a seed of the case and the rank."""
    g = torch.Generator(device=device).manual_seed(M * 31 + N * 7 + K + 7919 * rank)
    if op == "all_gather_matmul":          # a [M/world, K] rows, w [N/world, K] (column-parallel)
        shape_a, shape_w = (M // world, K), (N // world, K)
    else:                                  # a [M, K/world], w [N, K/world] (row-parallel)
        shape_a, shape_w = (M, K // world), (N, K // world)
    a = torch.randn(shape_a, generator=g, device=device).to(torch.bfloat16)
    w = (torch.randn(shape_w, generator=g, device=device) / K ** 0.5).to(torch.bfloat16)
    return a, w


def reference(op, M, N, K, rank, world, device):
    parts = [inputs(op, M, N, K, r, world, device) for r in range(world)]
    if op == "all_gather_matmul":
        a = torch.cat([p[0] for p in parts]).float()
        return a @ parts[rank][1].float().T
    full = sum(p[0].float() @ p[1].float().T for p in parts)
    rows = M // world
    return full[rank * rows:(rank + 1) * rows]


def main() -> int:
    ctx = td.init()
    rank, world = ctx.rank, ctx.world_size
    cap = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    if ctx.backend == "cuda":
        sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count
        print(f"rank {rank}/{world} (MPS cap {cap}): CUDA reports {sms} SMs, grids use "
              f"{ctx.usable_sms}", flush=True)
    bad = 0
    for op, M, N, K in CASES:
        a, w = inputs(op, M, N, K, rank, world, ctx.device)
        want = reference(op, M, N, K, rank, world, ctx.device)
        for schedule in SCHEDULES:       # "fused": the persistent kernel that starved
            got = getattr(ctx, op)(a, w, schedule=schedule).float()
            ctx.sync()
            err = float((got - want).norm() / want.norm())
            ok = err < 2e-2
            bad += not ok
            print(f"rank {rank}/{world} (MPS cap {cap}): {op} M={M} N={N} K={K} {schedule}: "
                  f"relative error {err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
    worst = torch.tensor([bad], dtype=torch.int64)
    torch.distributed.all_reduce(worst)          # gloo group: CPU tensor
    ctx.close()
    if rank == 0:
        print(f"held-out cases at world {world}: {'all right' if not int(worst) else f'{int(worst)} WRONG'}")
    return 1 if int(worst) else 0


if __name__ == "__main__":
    sys.exit(main())
