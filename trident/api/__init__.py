"""The public Context: trident.init and trident.Context (context.py), the runtime's
context with the families' methods (context_ops.py). Above ccl, ops, moe, nodes, trace
and sanitize, below the torch integration and the tools (tests/test_layers.py)."""
from .context import Context, init

__all__ = ["Context", "init"]
