"""torch.distributed on trident: a program changes one line, the backend's name.

    torchrun --nproc-per-node 2 examples/torch_backend.py          # GPUs, or CPU ranks
    torchrun --nproc-per-node 2 examples/torch_backend.py --backend cuda:trident,cpu:gloo
    python examples/torch_backend.py                               # 2 ranks via trident.launch

The rest is plain torch: an all_reduce, and an MLP under tensor parallelism
(parallelize_module over a DeviceMesh), whose collectives now run as trident kernels.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import trident  # registers backend "trident"


def main(backend: str = "trident") -> tuple:
    if not dist.is_initialized():                       # under torchrun
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        dist.init_process_group(backend)                # the one line: was "nccl"
    rank, world = dist.get_rank(), dist.get_world_size()
    device = trident.torch.backend.device()             # cuda, or cpu on the emulation

    t = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(t)                                  # trident's all_reduce, in place

    torch.manual_seed(0)                                # the same weights on every rank
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)).to(device)
    mesh = init_device_mesh(device.type, (world,))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1)).to(device)
    y = model(x)                                        # an all_reduce inside RowwiseParallel
    return rank, t[0].item(), round(y.sum().item(), 3)


def _launched(ctx):                                     # trident.launch gives each rank a ctx
    return main()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="trident",
                        help='"trident" or a device map such as "cuda:trident,cpu:gloo"')
    args = parser.parse_args()
    if "RANK" in os.environ:                            # torchrun started this rank
        rank, total, out = main(args.backend)
        print(f"rank {rank}: all_reduce {total} tp output sum {out}")
        dist.destroy_process_group()
    else:
        for rank, total, out in trident.launch(_launched, 2, dist_backend=args.backend):
            print(f"rank {rank}: all_reduce {total} tp output sum {out}")
