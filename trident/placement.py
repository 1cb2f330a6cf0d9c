"""Where ranks live: which GPU a rank uses, how many ranks share it, and how many SMs the
grids of one rank may fill.

Ranks are placed round-robin over the visible GPUs (rank r on GPU r % gpus), so a
machine with fewer GPUs than ranks runs several ranks per GPU. That is a correctness and
host-cost mode, not a speed mode: peers on one GPU reach each other through HBM, not
NVLink. Two things make it work:
- co-residency: a kernel that waits for a peer's kernel can only finish if both are
  resident at once. Every grid that is sized from the SM count (persistent GEMMs, MoE,
  the collectives' program counts) uses `usable_sms`, the rank's share of the SMs, so
  that every rank's programs fit on the GPU together;
- concurrency: without MPS, processes on one GPU time-slice and every cross-rank wait
  costs a time slice (4.6 ms per flag round trip measured on one H200, against 1.9 us
  under MPS). The launcher starts a private MPS daemon for the job (trident/mps.py).

The share is process-wide: a Context sets it once (`set_ranks_per_device`) after it has
found which ranks of its group use its GPU, before any kernel is sized.
"""
from __future__ import annotations

import os

_ranks_per_device = 1
_sms: dict = {}                # (device index, ranks per device) -> usable SMs


def device_index(local_rank: int, num_gpus: int) -> int:
    """The GPU of a rank: round-robin over the visible GPUs."""
    if num_gpus < 1:
        raise ValueError("no GPU is visible")
    return local_rank % num_gpus


def ranks_on_each_gpu(world_size: int, num_gpus: int) -> list[int]:
    """How many of `world_size` round-robin ranks land on each GPU."""
    return [len(range(g, world_size, num_gpus)) for g in range(min(num_gpus, world_size))]


def set_ranks_per_device(n: int) -> None:
    """Record how many ranks of the job share this process's GPU (1: a GPU of its own)."""
    global _ranks_per_device
    if n < 1:
        raise ValueError(f"ranks per device must be at least 1, got {n}")
    _ranks_per_device = int(n)


def ranks_per_device() -> int:
    return _ranks_per_device


def mps_thread_percentage() -> int | None:
    """CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of this process (an MPS client's cap), if set."""
    value = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "").strip()
    if not value:
        return None
    try:
        pct = float(value)
    except ValueError:
        return None
    return int(pct) if 0 < pct <= 100 else None


def share_of_sms(reported: int, ranks: int, percentage: int | None = None) -> int:
    """SMs one of `ranks` ranks on a GPU may fill so that every rank's programs are
    resident together. `reported`: the SM count CUDA reports to this process.
    - An MPS client with an active-thread percentage is already held to its share, and CUDA
      reports that share (measured on an H100: 66 of 132 SMs at 50 %, 32 at 25 %): use it.
      (With the percentage set but no MPS the processes time-slice, and then residency
      is not what lets a wait end.)
    - Otherwise reported // ranks, rounded down to whole TPCs (pairs of SMs)."""
    if percentage is not None or ranks <= 1:
        return max(1, reported)
    return max(1, reported // ranks // 2 * 2 or reported // ranks)


def usable_sms(device) -> int:
    """The SMs this rank's grids may fill on `device` (a torch.device or index)."""
    import torch
    index = device.index if isinstance(device, torch.device) else int(device)
    if index is None:
        index = torch.cuda.current_device()
    key = (index, _ranks_per_device)
    sms = _sms.get(key)
    if sms is None:
        reported = torch.cuda.get_device_properties(index).multi_processor_count
        sms = _sms[key] = share_of_sms(reported, _ranks_per_device, mps_thread_percentage())
    return sms
