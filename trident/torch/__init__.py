"""trident's PyTorch integration, above the families it wraps (ccl, ops, moe, nodes):

    ops/        trident's collectives, fused ops and MoE calls as torch custom ops
                (torch.ops.trident.*): usable in torch.compile, CUDA graphs and
                autograd, with differentiable functional forms (trident.torch.ops.all_reduce
                (ctx, t), ...). Loaded when the first context opens (the stand-ins
                torch.compile traces: trident/runtime/compiled.py).
    backend/    the torch.distributed backend "trident" (dist.init_process_group("trident")),
                registered by `import trident`.

Every `import torch` in trident is absolute, so this package's name never hides PyTorch.
"""
from __future__ import annotations

from ..runtime import context as _context
from . import backend


def _load_ops(ctx) -> None:
    from . import ops  # noqa: F401  (registers the custom ops and torch.compile's stand-ins)


def install() -> None:
    """Register the torch.distributed backend "trident", and have the custom ops load when
    the first context opens (`import trident` calls this)."""
    backend.register()
    _context.on_open(_load_ops)
