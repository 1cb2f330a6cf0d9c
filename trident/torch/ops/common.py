"""What the custom ops of trident/torch/ops/ share: the op namespace, and finding the
object an op's string argument names -- a Context (`group`: ctx.name,
trident/runtime/context.py) or an ExpertParallel (`ep`: ep.name, trident/moe) -- never a
Python object in the graph (the package docstring says why the names carry shapes)."""
from __future__ import annotations

import torch

from ...moe.expert_parallel import named as _named_expert_parallel
from ...runtime import context as _context

LIB = "trident::"


def op(name: str):
    """torch.ops.trident.<name>.default."""
    return getattr(torch.ops.trident, name).default


def context(group: str):
    """The open Context named `group` in this process."""
    ctx = _context.named(group)
    if ctx is None:
        raise RuntimeError(f"trident: no open Context named {group!r} in this process (open: "
                           f"{sorted(c.name for c in _context.open_contexts())}); it was "
                           f"closed, or the graph was made by another process")
    return ctx


def expert_parallel(name: str):
    """The ExpertParallel named `name` in this process."""
    ep = _named_expert_parallel(name)
    if ep is None:
        raise RuntimeError(f"trident: no ExpertParallel named {name!r} in this process")
    return ep


def no_launch_options(name: str, block, programs, options=None) -> None:
    """Inside torch.compile: refuse the collectives' launch options (the graph cannot
    carry them)."""
    if block is not None or programs is not None or options:
        raise ValueError(f"{name}: launch options (block, programs, ...) are not supported "
                         f"inside torch.compile")
