"""Process-wide settings that must be fixed before any kernel is defined.

trident picks the implementation of its device helpers at import time: the GPU one
(inline PTX, %globaltimer) or the CPU-emulation one (Triton interpreter). Kernels are
decorated with @triton.jit when their module is imported, so the choice has to be made
here, before any of them: with no CUDA device and no explicit TRITON_INTERPRET, trident
turns the interpreter on.

Under torchrun with more ranks on this host than visible GPUs (LOCAL_WORLD_SIZE), ranks
share GPUs and each must be capped to its share of one under MPS
(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, trident/runtime/placement.py). The cap only counts if it is in
the environment when the CUDA driver initialises in this process (cuInit, where the MPS
client connects), so it is set here, first -- before the availability check below, whose
torch.cuda.is_available() runs cuInit (cudaGetDeviceCount) -- when it is unset and the
driver is not initialised yet: a script that calls torch.cuda.set_device before
trident.init still gets it. trident.init checks the rest (an MPS daemon, a cap no larger
than the share) and refuses what it cannot fix.
"""
from . import options

# NVLink multicast stays off everywhere trident runs (see README: shared machines).
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
               ("NVSHMEM_DISABLE_NVLS", "1")):
    options.export_default(_k, _v)


def _interpret_asked() -> bool:
    """The CPU emulation asked for by the environment (no CUDA looked at)."""
    return options.get("TRIDENT_BACKEND") == "cpu" or options.get("TRITON_INTERPRET")


def _preset_mps_cap() -> None:
    """The MPS cap of a torchrun rank that shares its GPU (module docstring). Runs before
    anything here initialises the CUDA driver: torch.cuda.device_count() counts through
    NVML; a driver already initialised (by the script, before `import trident`) gets no
    cap, which would hold nothing, and trident.init refuses, naming what to export."""
    local = options.get("LOCAL_WORLD_SIZE")
    if _interpret_asked() or local is None or options.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
        return
    import torch
    from .placement import CAP_VAR, driver_initialized, fair_share, ranks_on_my_gpu
    if driver_initialized():
        return
    ranks = ranks_on_my_gpu(local, torch.cuda.device_count(), options.get("LOCAL_RANK", 0))
    if ranks > 1:
        options.export(CAP_VAR, fair_share(ranks))


_preset_mps_cap()     # first: the availability check below initialises the CUDA driver


def _cuda_available() -> bool:
    if options.get("TRIDENT_BACKEND") == "cpu":
        return False
    import torch
    return torch.cuda.is_available()


if options.raw("TRITON_INTERPRET") is None and not _cuda_available():
    options.export("TRITON_INTERPRET", "1")

INTERPRET: bool = options.get("TRITON_INTERPRET")
