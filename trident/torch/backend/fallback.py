"""The agreement of a fallback across ranks (trident/torch/backend/group.py `_fall`).

A collective that trident serves for some inputs only (all_reduce, the all-gathers and
reduce-scatters, all_to_all_single, broadcast) falls back to the inner group where the
reduction, dtype, device or tensor list is not one it serves. Each rank decides from its
own arguments: where they differ between ranks (a float64 tensor on one rank, float32 on
the others), one rank waited in the inner group's collective and the others in trident's
kernel, each until its timeout. So where the group has a context, a fallback first meets
its peers in a host exchange published as a host call (Context.host_call): a peer in
trident's kernel stops at once (its output poisoned) and raises CallMismatch naming both
calls at its next call, as this rank does; ranks that fall back alike go on to the inner
group, after one host round trip. The ops that always fall back (FALLBACK_OPS: send,
recv, gather, ...) decide nothing and skip it; so does every call of a group without a
context, and every call trident serves (the warm path is unchanged).
"""
from __future__ import annotations

import torch

from ...runtime.errors import CallMismatch, CommTimeout

# the host exchange's name (runtime/errors.py HOST_CALLS: a peer's kernel names it)
NAME = "fallback"


def agree(ctx, op: str, args: tuple) -> None:
    """Meet the peers before `op` falls back with torch.distributed arguments `args` (its
    outputs first, in args[0]). Raises CallMismatch (or PeerFailed, HostTimeout) on
    every rank where a peer made another call or fell back otherwise, with args[0]'s
    tensors poisoned (NaN, all bits set for integers) as a failed trident call leaves
    its outputs."""
    tensors = list(_tensors(args))
    detail = f"dist.{op} of {', '.join(sorted({_kind(t) for t in tensors})) or 'no tensors'}"
    red = next((a.reduceOp.op.name for a in args if hasattr(a, "reduceOp")), None)
    if red is not None:
        detail += f" ({red})"
    try:
        details = ctx.host_call(NAME, detail)
        if details is not None:
            lines = "; ".join(f"rank {r}: {d}" for r, d in enumerate(details))
            raise CallMismatch(op, ctx.rank, None, message=(
                f"rank {ctx.rank}: {op}: the ranks handed different calls to the inner "
                f"group (a fallback: {lines}). Every rank must make the same calls with "
                f"the same dtypes and devices; outputs of this call are not valid; call "
                f"ctx.reset() on every rank"))
    except CommTimeout:
        poison(_tensors(args[:1]))
        raise


def poison(tensors) -> None:
    """Fill each tensor as a failed call leaves its outputs: NaN for floating and complex
    types, all bits set for integers (True for bool)."""
    for t in tensors:
        if t.is_floating_point() or t.is_complex():
            t.fill_(float("nan"))
        elif t.dtype == torch.bool:
            t.fill_(True)
        else:        # a signed view of the same width: -1 is all bits set, any strides
            t.view(_SIGNED[t.element_size()]).fill_(-1)


_SIGNED = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _kind(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} on {t.device.type}"


def _tensors(obj):
    """The tensors in torch.distributed arguments (tensors, lists of them, nested)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
