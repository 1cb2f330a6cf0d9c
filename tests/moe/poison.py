"""Uninitialised memory made visible on the CPU emulation.

On a GPU, torch.empty and ctx.empty hand back whatever the memory held before (old
tensors, other tests' data, often NaN when read as bf16 or e4m3); on the CPU a fresh
allocation is usually zeros, so a kernel or an example that reads an element nobody
wrote passes there and fails on the GPU. Inside `poisoned(ctx)` every such allocation
is filled with 0xFF bytes: NaN in fp32/bf16/fp16 and float8_e4m3fn, -1 in integers. A
read of an unwritten element then shows as NaN (or a bad index) on the CPU as well.

It patches torch in the calling (rank) process only and restores it on exit.
"""
from __future__ import annotations

import contextlib
import types

import torch


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill t's bytes with 0xFF (in place; bool tensors are left alone) and return it."""
    if t.dtype != torch.bool and t.numel() and t.is_contiguous():
        t.view(-1).view(torch.uint8).fill_(0xFF)
    return t


def _poisoning(factory):
    def make(*args, **kwargs):
        return poison(factory(*args, **kwargs))
    return make


@contextlib.contextmanager
def poisoned(ctx):
    """torch.empty, torch.empty_like, Tensor.new_empty and ctx.empty / ctx.empty_like
    return 0xFF-filled tensors inside the block (this process only)."""
    saved = [(torch, "empty", torch.empty), (torch, "empty_like", torch.empty_like),
             (torch.Tensor, "new_empty", torch.Tensor.new_empty)]
    torch.empty = _poisoning(torch.empty)
    torch.empty_like = _poisoning(torch.empty_like)
    torch.Tensor.new_empty = _poisoning(torch.Tensor.new_empty)
    # ctx.empty: instance attributes shadow the class's methods, `del` restores them
    cls = type(ctx)
    ctx.empty = types.MethodType(lambda self, *shape, dtype=torch.float32:
                                 poison(cls.empty(self, *shape, dtype=dtype)), ctx)
    ctx.empty_like = types.MethodType(lambda self, t: poison(cls.empty_like(self, t)), ctx)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
        del ctx.empty, ctx.empty_like
