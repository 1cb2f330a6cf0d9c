"""CPU backend: one shared-memory file per rank, mapped by every rank of the job.

Each rank creates /dev/shm/trident-<job>-<rank>, every rank maps every file, and each
file is unlinked as soon as all ranks hold their mappings, so nothing stays behind in
/dev/shm whether the job ends well or crashes (the launcher also removes leftovers of a
job whose ranks died before that point). Mappings are made with mmap(2) directly so that
close() returns the memory at once.
"""
from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np
import torch
import torch.distributed as dist

SHM_DIR = "/dev/shm"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def shm_path(job: str, rank: int) -> str:
    return os.path.join(SHM_DIR, f"trident-{job}-{rank}")


def _map(path: str, size: int) -> int:
    fd = os.open(path, os.O_RDWR)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    finally:
        os.close(fd)
    if addr in (None, _MAP_FAILED):
        raise OSError(ctypes.get_errno(), f"mmap of {path} ({size} B) failed")
    return addr


class CpuHeap:
    """The heaps of all ranks, mapped into this process."""

    def __init__(self, size: int, rank: int, world_size: int, group, job: str):
        self.size, self.rank, self.world_size = size, rank, world_size
        self._addrs: list[int] = []
        path = shm_path(job, rank)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
        except BaseException:
            os.unlink(path)          # the next context of this job makes the same file
            raise
        finally:
            os.close(fd)
        try:
            dist.barrier(group)                      # every file exists
            self._addrs = [_map(shm_path(job, r), size) for r in range(world_size)]
            dist.barrier(group)                      # every rank holds every mapping
        finally:
            os.unlink(path)
        buf = (ctypes.c_uint8 * size).from_address(self._addrs[rank])
        self.local = torch.from_numpy(np.frombuffer(buf, dtype=np.uint8))
        self.bases = list(self._addrs)

    def peer_view(self, peer: int, local: torch.Tensor, start: int, numel: int) -> torch.Tensor:
        """A torch tensor over `peer`'s copy of local[start:start+numel] (its mapping here)."""
        size = local.element_size()
        if numel == 0:
            return torch.empty(0, dtype=local.dtype)
        offset = local.data_ptr() - self.local.data_ptr() + start * size
        buf = (ctypes.c_uint8 * (numel * size)).from_address(self._addrs[peer] + offset)
        return torch.frombuffer(buf, dtype=torch.uint8).view(local.dtype)

    def close(self) -> None:
        self.local = None
        for addr in self._addrs:
            _libc.munmap(addr, self.size)
        self._addrs = []
