"""`trident info`: what trident would run on here -- backend, versions, ranks and GPUs,
NVLink topology, heap size, and which tables the collectives select their algorithm from and
the GEMM core takes its configs from."""
from __future__ import annotations

import subprocess

import torch
import triton

from ..runtime import _env, options


def info() -> int:
    """Print the facts above; returns the exit status (0)."""
    backend = "cpu (Triton interpreter)" if _env.INTERPRET else "cuda"
    print(f"trident backend: {backend}")
    print(f"torch {torch.__version__}, triton {triton.__version__}")
    heap = options.get("TRIDENT_HEAP_SIZE")
    print(f"heap size per rank: {heap} B ({heap / 2**20:.0f} MiB; TRIDENT_HEAP_SIZE to change)")
    if not _env.INTERPRET and torch.cuda.is_available():
        n = torch.cuda.device_count()
        print(f"ranks: {n} by default (one per GPU)")
        _sharing_info(n)
        for i in range(n):
            p = torch.cuda.get_device_properties(i)
            print(f"  GPU {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB, "
                  f"{p.multi_processor_count} SMs")
        try:
            topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                                  timeout=20).stdout
            print("NVLink topology (nvidia-smi topo -m):\n" + topo)
        except Exception as exc:
            print(f"NVLink topology: unavailable ({exc})")
    else:
        print("ranks: 4 CPU processes by default (trident demo --world-size N)")
    _selector_info()
    _gemm_info()
    _nodes_info()
    from ..torch import backend as torch_backend
    print(torch_backend.describe())
    return 0


def _nodes_info() -> None:
    """The layout of nodes and rails that TRIDENT_NODE_SIZE gives the default world, and
    the network parameters of the cost model across nodes."""
    from ..nodes import cost, topology
    world = 4 if _env.INTERPRET else max(torch.cuda.device_count(), 1)
    try:
        node_size = topology.node_size_from_env(world)
    except ValueError as exc:
        print(f"nodes: {exc}")
        return
    if node_size is None:
        print(f"nodes: one per host (or LOCAL_WORLD_SIZE under torchrun); "
              f"{topology.NODE_SIZE_ENV}=n splits one machine's ranks into nodes of n")
        return
    print(f"nodes at {world} ranks: "
          + topology.layout(world, node_size, f"{topology.NODE_SIZE_ENV}={node_size}"))
    try:
        gbps, us = cost.internode()
        print(f"between nodes (cost model): {gbps:g} GB/s, {us:g} us per hop "
              f"({cost.INTER_GBPS_ENV}, {cost.INTER_US_ENV})")
    except ValueError as exc:
        print(f"between nodes: {exc}")


def _sharing_info(gpus: int) -> None:
    """How more ranks than GPUs would run, and how the heap is mapped."""
    from ..runtime import mps
    binary = mps.control_binary()
    pipe_dir = options.get("CUDA_MPS_PIPE_DIRECTORY")
    if mps.daemon_reachable(binary, pipe_dir):
        state = f"an MPS daemon runs at {pipe_dir}"
    elif binary:
        state = f"no MPS daemon runs; the launcher starts a private one ({binary})"
    else:
        state = "no MPS daemon and no nvidia-cuda-mps-control: ranks would time-slice"
    print(f"more ranks than GPUs (trident demo --world-size N, td.launch(fn, N)): round-robin "
          f"over the {gpus} GPU(s), gloo host group, grids sized by each rank's share of the "
          f"SMs; {state}")
    print("heap mapping: torch symmetric memory (CUDA virtual-memory handles exchanged over "
          "the process group; peers mapped through NVLink peer access, or on the same GPU "
          "with TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 when ranks share it)")


def _gemm_info() -> None:
    """Which table the GEMM core takes its configs from on this device (gemm_tables.lookup)."""
    from ..ops import gemm, gemm_tables
    name, capability = gemm.gpu_identity()
    where = gemm_tables.lookup(name, capability)[1]
    unused = "; unused here: the interpreter runs its own small tiles" if _env.INTERPRET else ""
    print(f"GEMM core table for {name}: {where}{unused}")


def _selector_info() -> None:
    """Which algorithm tables the collectives use at the default world size."""
    from ..ccl import selector
    world = 4
    if not _env.INTERPRET:
        world = max(torch.cuda.device_count(), 1)
    print(f"collective selection at {world} ranks: {selector.describe(world)}")
