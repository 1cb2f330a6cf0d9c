"""trident: Triton kernels that read, write and signal each other's memory across the
GPUs of one NVLink node, through a symmetric heap -- and run on the CPU for testing.

The package is a stack of families, each a folder, each importing only those below it
(tests/test_layers.py holds the order): runtime/ (context, heap, launch, plans, errors),
language/ (the device API), trace/ and sanitize/, ccl/, ops/ and moe/, nodes/, api/
(trident.Context and trident.init), torch/ (custom ops, torch.distributed backend), and
compat/, bench/, tools/ on top.
"""
from .runtime import _env  # noqa: F401  (must come first: picks GPU or interpreter helpers)
from . import errors, language  # noqa: F401  (trident.errors, trident.language)
from .api import Context, init
from .runtime.errors import CommTimeout, HeapMismatchError
from .runtime.heap import HeapFullError
from .runtime.launch import launch
from . import torch as _torch

_torch.install()       # dist.init_process_group("trident"); custom ops at the first context

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
