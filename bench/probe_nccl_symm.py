"""Does NCCL run its symmetric kernels on buffers of bench ccl's `nccl_symm` pool?

Two ranks, one GPU each (torchrun --nproc-per-node 2 bench/probe_nccl_symm.py): allocates
an all_reduce / all_gather buffer in the pool (trident.bench.ccl.nccl_symm_pool), runs each
collective under torch.profiler and prints the CUDA kernel names NCCL launched, beside the
same collective on a plain buffer. NCCL's symmetric kernels are named ncclSymk*.
"""
import os

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile


def kernels(fn) -> list[str]:
    fn(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(); torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})


def main():
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    from trident.bench import ccl

    class Ctx:                       # what nccl_symm_pool reads of a trident context
        backend, device, group = "cuda", torch.device("cuda", rank), dist.group.WORLD
        nccl_available = True
    pool = ccl.nccl_symm_pool(Ctx())
    print(f"rank {rank}: pool: {ccl._SYMM_POOL.get('why')}", flush=True)
    n = 1 << 16
    plain = torch.ones(n, device="cuda", dtype=torch.bfloat16)
    out_plain = torch.empty(2 * n, device="cuda", dtype=torch.bfloat16)
    cases = {"plain": (plain, out_plain)}
    if pool is not None:
        with torch.cuda.use_mem_pool(pool):
            cases["symm"] = (torch.ones(n, device="cuda", dtype=torch.bfloat16),
                             torch.empty(2 * n, device="cuda", dtype=torch.bfloat16))
    for name, (t, out) in cases.items():
        ar = kernels(lambda: dist.all_reduce(t))
        ag = kernels(lambda: dist.all_gather_into_tensor(out, t))
        if rank == 0:
            print(f"{name}: all_reduce kernels {ar}; all_gather kernels {ag}", flush=True)
    del cases, t, out                 # free the pool's blocks before the communicator goes
    ccl.release_symm_pool()           # deregistered and dropped while the communicator lives
    dist.destroy_process_group()      # then a normal exit (it aborted when the pool outlived it)


if __name__ == "__main__":
    main()
