"""CUDA backend: one torch symmetric-memory allocation per rank (NVLink peer mappings)."""
from __future__ import annotations

import torch


class CudaHeap:
    def __init__(self, size: int, rank: int, world_size: int, group, device: torch.device):
        import torch.distributed._symmetric_memory as symm_mem
        self.size, self.rank, self.world_size = size, rank, world_size
        self.local = symm_mem.empty(size, dtype=torch.uint8, device=device)
        self._handle = symm_mem.rendezvous(self.local, group.group_name)
        self.bases = [int(p) for p in self._handle.buffer_ptrs]

    def close(self) -> None:
        self._handle = None
        self.local = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
