"""trident: Triton kernels that read, write and signal each other's memory across the
GPUs of one NVLink node, through a symmetric heap -- and run on the CPU for testing."""
from . import _env  # noqa: F401  (must come first: picks GPU or interpreter helpers)
from .context import Context, init
from .errors import CommTimeout, HeapMismatchError
from .heap import HeapFullError
from .launch import launch
from . import torch_backend as _torch_backend

_torch_backend.register()          # dist.init_process_group("trident") (trident/torch_backend)

__version__ = "0.1.0"


def __getattr__(name):
    if name == "ExpertParallel":           # MoE dispatch/combine (trident/moe)
        from .moe import ExpertParallel
        return ExpertParallel
    if name == "WorldContext":             # what init returns across nodes (trident/nodes/world.py)
        from .nodes.world import WorldContext
        return WorldContext
    raise AttributeError(f"module 'trident' has no attribute {name!r}")


__all__ = ["init", "Context", "launch", "CommTimeout", "HeapFullError", "HeapMismatchError",
           "ExpertParallel", "WorldContext"]
