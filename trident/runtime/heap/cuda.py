"""CUDA backend: one torch symmetric-memory allocation per rank (NVLink peer mappings).

torch numbers a rendezvous's store keys with a counter per process, not per group
(CUDASymmetricMemory's store_comm_seq_id). A rank that maps a heap its peers do not -- a
trident group over a subset of the ranks -- is one ahead of them from then on, and a later
rendezvous over a group with those peers waits for keys they never write (a 60 s store
timeout). So the ranks of a heap first agree on how many trident heaps each process has
mapped, and a rank behind catches up with rendezvous over a group of itself alone
(`_catch_up`); a group of one rank maps nothing (it has no peers), so it never puts its
process ahead. The count covers trident's heaps: other rendezvous in the program (torch
symm-mem ops of its own) must be made by every rank alike, as torch requires anyway.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

_mapped = 0             # rendezvous made in this process for trident heaps (and catch-ups)
_alone = None           # this process's group of itself alone, for catch-ups


def _rendezvous(local: torch.Tensor, group):
    """torch's rendezvous of `local` over `group`, after every rank of it has made as
    many as the rank furthest ahead."""
    import torch.distributed._symmetric_memory as symm_mem
    global _mapped
    counts = [None] * dist.get_world_size(group)
    dist.all_gather_object(counts, _mapped, group=group)
    for _ in range(max(counts) - _mapped):
        _catch_up(local.device)
    handle = symm_mem.rendezvous(local, group.group_name)
    _mapped += 1
    return handle


def _catch_up(device: torch.device) -> None:
    """One rendezvous over a group of this rank alone: it moves torch's counter by one
    without a peer."""
    import torch.distributed._symmetric_memory as symm_mem
    global _mapped, _alone
    if _alone is None:
        _alone = dist.new_group([dist.get_rank()], backend="gloo",
                                use_local_synchronization=True)
    symm_mem.rendezvous(symm_mem.empty(16, dtype=torch.uint8, device=device),
                        _alone.group_name)
    _mapped += 1


class CudaHeap:
    def __init__(self, size: int, rank: int, world_size: int, group, device: torch.device):
        import torch.distributed._symmetric_memory as symm_mem
        self.size, self.rank, self.world_size = size, rank, world_size
        self.local = symm_mem.empty(size, dtype=torch.uint8, device=device)
        # a group of one has no peer to map, and its rendezvous would move this process's
        # counter alone (module docstring)
        self._handle = _rendezvous(self.local, group) if world_size > 1 else None
        self.bases = ([int(p) for p in self._handle.buffer_ptrs] if self._handle is not None
                      else [self.local.data_ptr()])

    def peer_view(self, peer: int, local: torch.Tensor, start: int, numel: int) -> torch.Tensor:
        """A torch tensor over `peer`'s copy of local[start:start+numel] (for copy-engine
        baselines: torch copy_ into it goes over NVLink)."""
        if self._handle is None:             # a group of one: the peer is this rank
            return local.view(-1)[start:start + numel]
        offset = (local.data_ptr() - self.local.data_ptr()) // local.element_size() + start
        return self._handle.get_buffer(peer, (numel,), local.dtype, offset)

    def close(self) -> None:
        self._handle = None
        self.local = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
