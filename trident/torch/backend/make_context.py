"""The trident Context of a "trident" process group, made over its inner group.

A group whose ranks span nodes has no heap in common (the heap is mapped within a node),
so it gets no context and every call falls back to the inner group; trident.init's
hierarchical WorldContext is not used here, since it makes sub-groups over the whole job,
which the ranks of a sub-group's first collective cannot do.
"""
from __future__ import annotations

import torch.distributed as dist


def make_context(inner, options):
    """Collective over the inner group: (the Context, None), or (None, why there is none)."""
    from ...nodes import topology
    from ...api.context import Context
    size, rank = dist.get_world_size(inner), dist.get_rank(inner)
    source = "one rank"
    if size > 1:
        nodes, source = topology.find_nodes(inner)
        if len(set(nodes)) > 1:
            return None, (f"the group's ranks span nodes ({nodes}, from {source}): trident's "
                          f"heap is mapped within a node, so every call goes to the inner "
                          f"group")
    ctx = Context(heap_size=options.heap_size, group=inner, timeout=options.timeout,
                  debug=options.debug)
    ctx.topology = topology.Topology(size, rank, size, source)
    return ctx, None
