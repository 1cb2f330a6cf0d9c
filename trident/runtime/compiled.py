"""What torch.compile traces in place of trident's eager entries.

trident.torch.ops (loaded when the first context opens) puts a stand-in in STANDINS for
each entry a compiled function may call -- the five collectives, all_reduce_add_rmsnorm
and the fused ops -- under the entry's name: a function of the entry's arguments that
calls the entry's custom op. Each entry asks `is_compiling()` first and, while Dynamo
traces it, returns what its stand-in returns: Dynamo folds the question to True, so it
never traces the eager body (the plan cache, the launches). Eagerly the question costs
~60 ns a call.

The entries ask rather than being substituted with torch.compiler.substitute_in_graph,
which imports torch._dynamo (about 2 s of CPU in every process at its first context) and
is not consulted where the entry is called as a method: Context's collectives are ccl's
entries themselves after their first call (api/context_ops.py `_bound`).
"""
from torch.compiler import is_compiling

__all__ = ["STANDINS", "is_compiling"]

STANDINS: dict = {}        # entry name -> the function Dynamo traces in its place
