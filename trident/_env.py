"""Process-wide settings that must be fixed before any kernel is defined.

trident picks the implementation of its device helpers at import time: the GPU one
(inline PTX, %globaltimer) or the CPU-emulation one (Triton interpreter). Kernels are
decorated with @triton.jit when their module is imported, so the choice has to be made
here, before any of them: with no CUDA device and no explicit TRITON_INTERPRET, trident
turns the interpreter on.
"""
import os

# NVLink multicast stays off everywhere trident runs (see README: shared machines).
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
               ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)


def _cuda_available() -> bool:
    if os.environ.get("TRIDENT_BACKEND") == "cpu":
        return False
    import torch
    return torch.cuda.is_available()


if "TRITON_INTERPRET" not in os.environ and not _cuda_available():
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")
