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
  under MPS). The launcher starts a private MPS daemon for the job (trident/runtime/mps.py).

The share is process-wide: a Context sets it once (`set_ranks_per_device`) after it has
found which ranks of its group use its GPU, before any kernel is sized.

Co-residency is enforced, never assumed. Under MPS a client without a cap may fill the
whole GPU, and then a peer's programs that a grid waits for may never be resident (held-out
fused-op cases came back wrong, with no error, under torchrun with an MPS daemon and no cap).
So every rank that shares a GPU runs with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE at most its fair
share (100 // ranks on the GPU). `share_plan` is the decision (a pure function of the ranks
per GPU, the environment, whether the CUDA driver is initialised and whether an MPS daemon
answers); `ensure_share` applies it in this process: `import trident` (trident/runtime/_env.py) and
trident.init call it before CUDA initialises (torchrun's LOCAL_WORLD_SIZE against the
visible GPUs), a Context again once it has counted the ranks on its GPU. The cap must be in
the environment when the CUDA *driver* initialises (cuInit: the MPS client connects to its
server then), which is earlier than torch's own lazy init: torch.cuda.is_available() calls
cudaGetDeviceCount, which runs cuInit, while torch.cuda.is_initialized() stays False
(`driver_initialized` asks the driver itself). torch.cuda.device_count() counts through NVML
and does not initialise the driver. A cap set after cuInit comes too late, and then
nothing holds the rank to its share: a fused kernel of one program per tile (hundreds) can
fill every SM while its peer's kernel waits behind it (bench/heldout_torchrun.py on one
H100: trident used to set the cap after its own import had called torch.cuda.is_available()).
The launcher (trident/runtime/launch.py) sets the cap for its ranks before they start.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

from . import mps, options

CAP_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
_ranks_per_device = 1
_sms: dict = {}                # (device index, ranks per device, cap) -> usable SMs
_UNKNOWN = object()
_cap_in_force = _UNKNOWN       # ensure_share's finding: the MPS cap of this process, or None
_mps_answers: dict = {}        # pipe directory -> whether an MPS control daemon answered
_libcuda = None                # the CUDA driver library, for driver_initialized
CUDA_ERROR_NOT_INITIALIZED = 3


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


def ranks_on_my_gpu(local_world_size: int, gpus: int, local_rank: int) -> int:
    """How many of a host's `local_world_size` round-robin ranks share the GPU of
    `local_rank` (1: a GPU of its own; 0 GPUs visible: 1, there is nothing to share)."""
    if gpus < 1 or local_world_size <= gpus:
        return 1
    return ranks_on_each_gpu(local_world_size, gpus)[device_index(local_rank, gpus)]


def gpu_sharing(everyone: list, me) -> tuple[int, bool]:
    """From every rank's GPU (`everyone`: one (host, GPU uuid) per rank, the same list on
    every rank) and this rank's (`me`): (ranks on this rank's GPU, whether every rank has a
    GPU of its own). The second is the same on every rank, as whatever decides the
    protocol must be: NCCL can serve the group only if no rank shares a GPU (a rank alone
    on its GPU beside ranks that share one is in a gloo group too)."""
    return everyone.count(me), len(set(everyone)) == len(everyone)


def fair_share(ranks_per_gpu: int) -> int:
    """The MPS active-thread percentage of one of `ranks_per_gpu` ranks on a GPU."""
    return 100 // max(1, ranks_per_gpu)


def _parse_cap(value: str) -> float:
    try:
        pct = float(value)
    except ValueError:
        pct = float("nan")
    if not 0 < pct <= 100:                      # also NaN
        raise ValueError(f"{CAP_VAR}={value!r} is not a percentage in (0, 100]")
    return pct


def share_plan(ranks_per_gpu: int, env: Mapping[str, str], cuda_initialized: bool,
               mps_running: bool) -> tuple[dict[str, str], float | None]:
    """What a process whose GPU is shared by `ranks_per_gpu` ranks (itself included) needs
    so that every rank's programs stay resident together (module docstring). Pure: `env`
    is read, never written. Returns (variables to set in this process's environment before
    CUDA initialises, the MPS cap that is then in force: a percentage, or None when the
    ranks do not run under MPS). Raises:
    - RuntimeError when the ranks share a GPU without an MPS daemon (`mps_running` False)
      and TRIDENT_MPS=require (a RuntimeWarning under "auto": they time-slice, slowly but
      correctly); or when CUDA is initialised
      already without a cap (too late to set one: it names what to export);
    - ValueError when the cap is not a percentage, or larger than the fair share: its
      grids, sized by the SMs the cap gives, could then keep a peer's programs off the GPU
      (refused, not warned: that is the silent wrong result this check exists for)."""
    if ranks_per_gpu <= 1:
        return {}, None
    share = fair_share(ranks_per_gpu)
    export = f"export {CAP_VAR}={share}"
    mode = options.get("TRIDENT_MPS", env=env)
    if not mps_running:
        if mode == "off":        # the user's (or the launcher's) choice: time-slice, slowly
            return {}, None
        # Without MPS the ranks time-slice the GPU: slow, but a waiting grid cannot starve
        # its peer (each slice runs one process alone). The probe can also miss a daemon
        # that is busy (4 ranks on one H100 were refused while 16 cores compiled), so this
        # warns; the cap below is still set, for the daemon that may be there.
        pipe = options.get("CUDA_MPS_PIPE_DIRECTORY", env=env)
        if mode == "require":
            raise RuntimeError(
                f"{ranks_per_gpu} ranks share this GPU but no MPS control daemon answers at "
                f"{pipe} (CUDA_MPS_PIPE_DIRECTORY), and TRIDENT_MPS=require: start one before "
                f"the job (`{mps.CONTROL} -d`) and {export} for every rank")
        why = mps.last_probe(pipe)
        warnings.warn(
            f"{ranks_per_gpu} ranks share this GPU but no MPS control daemon answered at "
            f"{pipe} (CUDA_MPS_PIPE_DIRECTORY{'; ' + why if why else ''}): without one the "
            f"ranks time-slice the GPU "
            f"(correct, but every cross-rank wait costs milliseconds). Start one before the "
            f"job (`{mps.CONTROL} -d`) and {export} for every rank, or set TRIDENT_MPS=off "
            f"to silence this", RuntimeWarning, stacklevel=3)
    value = (env.get(CAP_VAR) or "").strip()
    if not value:
        if cuda_initialized:
            raise RuntimeError(
                f"{ranks_per_gpu} ranks share this GPU under MPS, and CUDA was initialised in "
                f"this process (e.g. by torch.cuda.is_available(), before `import trident`) "
                f"before {CAP_VAR} was set, so nothing holds this rank to its "
                f"share of the SMs (a peer's programs may then never run; results can come "
                f"back wrong): {export} for every rank before starting the job (an MPS "
                f"daemon, `{mps.CONTROL} -d`, must be running), or import trident before "
                f"anything that uses CUDA")
        return {CAP_VAR: str(share)}, float(share)
    pct = _parse_cap(value)
    if pct * ranks_per_gpu > 100:
        raise ValueError(
            f"{CAP_VAR}={value} is more than this rank's share of the GPU: {ranks_per_gpu} "
            f"ranks share it, so at most {share} each; with more, a rank's grids can keep a "
            f"peer's programs off the GPU. {export} (or leave it unset: trident sets it)")
    return {}, pct


def _mps_running() -> bool:
    """Whether an MPS control daemon answers at this process's pipe directory (cached). A
    rank of trident.launch takes its launcher's word (mps.ANSWERED_ENV: the launcher found
    or started that daemon just before it started the ranks) while the control pipe is
    there; other processes ask the daemon."""
    pipe = options.get("CUDA_MPS_PIPE_DIRECTORY")
    if pipe not in _mps_answers:
        if (options.get(mps.ANSWERED_ENV) == pipe
                and os.path.exists(os.path.join(pipe, "control"))):
            _mps_answers[pipe] = True
        else:
            _mps_answers[pipe] = mps.daemon_reachable(mps.control_binary(), pipe)
    return _mps_answers[pipe]


def driver_initialized() -> bool:
    """Whether the CUDA driver is initialised in this process (cuInit ran: torch.cuda.
    is_available(), a CUDA tensor, anything), which torch.cuda.is_initialized() does not
    say (it is torch's lazy init, later). The driver answers: cuDeviceGetCount returns
    CUDA_ERROR_NOT_INITIALIZED before cuInit and initialises nothing. Without a driver
    library (the CPU emulation), torch.cuda.is_initialized()."""
    global _libcuda
    try:
        import ctypes
        if _libcuda is None:
            _libcuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        return _libcuda.cuDeviceGetCount(ctypes.byref(count)) != CUDA_ERROR_NOT_INITIALIZED
    except (OSError, AttributeError):
        import torch
        return torch.cuda.is_initialized()


def ensure_share(ranks_per_gpu: int) -> None:
    """Apply `share_plan` to this process: set the cap in its environment if it is missing and
    the CUDA driver is not initialised yet (`driver_initialized`), record the cap in force
    (usable_sms sizes grids by it), or raise as share_plan does. A no-op for a rank with a
    GPU of its own."""
    global _cap_in_force
    if ranks_per_gpu <= 1:
        return
    updates, cap = share_plan(ranks_per_gpu, options.environ(), driver_initialized(),
                              _mps_running())
    for name, value in updates.items():
        options.export(name, value)
    _cap_in_force = cap


def cap_in_force() -> float | None:
    """The MPS active-thread percentage this process runs under: what ensure_share found
    (None: no MPS), else CUDA_MPS_ACTIVE_THREAD_PERCENTAGE as set."""
    return mps_thread_percentage() if _cap_in_force is _UNKNOWN else _cap_in_force


def mps_thread_percentage() -> int | None:
    """CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of this process (an MPS client's cap), if set."""
    value = options.get(CAP_VAR)
    if value is None:
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
      (usable_sms passes the cap in force: none when the ranks run without MPS, where
      they time-slice and residency is not what lets a wait end.)
      A cap above the fair share (refused by share_plan; here for safety) is scaled down
      to it: CUDA reports percentage % of the SMs, the fair share is 100 / ranks % of them.
    - Otherwise reported // ranks, rounded down to whole TPCs (pairs of SMs)."""
    if ranks <= 1:
        return max(1, reported)
    if percentage is not None:
        if percentage * ranks <= 100:
            return max(1, reported)
        fair = int(reported * 100 / (percentage * ranks))
        return max(1, fair // 2 * 2 or fair)
    return max(1, reported // ranks // 2 * 2 or reported // ranks)


def usable_sms(device) -> int:
    """The SMs this rank's grids may fill on `device` (a torch.device or index)."""
    import torch
    index = device.index if isinstance(device, torch.device) else int(device)
    if index is None:
        index = torch.cuda.current_device()
    cap = _cap_in_force         # (a rank alone on its GPU is sized by what CUDA reports)
    if cap is _UNKNOWN:
        cap = mps_thread_percentage() if _ranks_per_device > 1 else None
    key = (index, _ranks_per_device, cap)
    sms = _sms.get(key)
    if sms is None:
        reported = torch.cuda.get_device_properties(index).multi_processor_count
        sms = _sms[key] = share_of_sms(reported, _ranks_per_device, cap)
    return sms
