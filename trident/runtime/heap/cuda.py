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

    def peer_view(self, peer: int, local: torch.Tensor, start: int, numel: int) -> torch.Tensor:
        """A torch tensor over `peer`'s copy of local[start:start+numel] (for copy-engine
        baselines: torch copy_ into it goes over NVLink)."""
        offset = (local.data_ptr() - self.local.data_ptr()) // local.element_size() + start
        return self._handle.get_buffer(peer, (numel,), local.dtype, offset)

    def close(self) -> None:
        self._handle = None
        self.local = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
