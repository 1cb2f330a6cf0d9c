"""The input checks of each collective, shared by the one-node collectives (ccl/__init__)
and the ones across nodes (trident/nodes/hierarchical): the same call is refused with the same
message on either. `ctx.world_size` is the world the call spans."""
from __future__ import annotations

import operator

from . import common
from .all_to_all.rows import check_no_overlap


def all_reduce(ctx, t, op: str) -> int:
    """Check all_reduce's tensor and op; returns the op's code."""
    common.check_tensor(ctx, t, "all_reduce: t")
    return common.check_reduce(t, "all_reduce: t", op)


def all_gather(ctx, out, inp) -> None:
    common.check_tensor(ctx, out, "all_gather: out")
    common.check_tensor(ctx, inp, "all_gather: inp")
    common.check_same_dtype(out, inp, "all_gather: out and inp")
    if inp.dim() == 0:
        raise ValueError("all_gather: inp must be at least 1-D (its rows are gathered), got "
                         "a 0-d tensor; pass inp.view(1)")
    if tuple(out.shape) != (ctx.world_size * inp.shape[0], *inp.shape[1:]):
        raise ValueError(f"all_gather: out must have shape [world_size * n, ...] = "
                         f"{[ctx.world_size * inp.shape[0], *inp.shape[1:]]} for inp of shape "
                         f"{list(inp.shape)}, got {list(out.shape)}")


def reduce_scatter(ctx, out, inp, op: str) -> int:
    """Check reduce_scatter's tensors and op; returns the op's code."""
    common.check_tensor(ctx, out, "reduce_scatter: out")
    common.check_tensor(ctx, inp, "reduce_scatter: inp")
    common.check_same_dtype(out, inp, "reduce_scatter: out and inp")
    code = common.check_reduce(inp, "reduce_scatter: inp", op)
    if out.dim() == 0 or tuple(inp.shape) != (ctx.world_size * out.shape[0], *out.shape[1:]):
        raise ValueError(f"reduce_scatter: inp must have shape [world_size * n, ...] for out "
                         f"of shape [n, ...] = {list(out.shape)}, got {list(inp.shape)}")
    return code


def broadcast(ctx, t, src) -> None:
    common.check_tensor(ctx, t, "broadcast: t")
    if not isinstance(src, int):
        # a numpy int or a 0-d tensor too: the plan's key and the kernels take a Python int
        raise TypeError(f"broadcast: src must be an int (a rank in 0..{ctx.world_size - 1}), "
                        f"got {type(src).__name__} {src!r}; pass int(src)")
    if isinstance(src, bool) or not 0 <= src < ctx.world_size:
        raise ValueError(f"broadcast: src must be a rank in 0..{ctx.world_size - 1}, got {src!r}")


def splits(ctx, t, splits, name: str) -> list[int]:
    """all_to_all's row counts per rank for `t` (even when `splits` is None), checked;
    `name`: "out" or "in" (the tensors out and inp, the arguments out_splits, in_splits)."""
    rows, arg = t.shape[0], f"{name}_splits"
    tensor = "inp" if name == "in" else name
    if splits is None:
        if rows % ctx.world_size:
            raise ValueError(f"all_to_all: {tensor} has {rows} rows, not a multiple of world "
                             f"size {ctx.world_size}; pass {arg} for uneven splits")
        return [rows // ctx.world_size] * ctx.world_size
    try:
        splits = [operator.index(s) for s in splits]     # ints, never a float truncated
    except TypeError:
        # (the plan's key holds a sequence as a tuple)
        shown = (repr(list(splits)) if isinstance(splits, (tuple, list))
                 else f"{splits!r} ({type(splits).__name__})")
        raise TypeError(f"all_to_all: {arg} must be a sequence of ints (row counts, one per "
                        f"rank), got {shown}") from None
    if len(splits) != ctx.world_size or min(splits) < 0 or sum(splits) != rows:
        raise ValueError(f"all_to_all: {arg} must be {ctx.world_size} non-negative "
                         f"row counts summing to {tensor}.shape[0] = {rows}, got {splits}")
    return splits


def all_to_all(ctx, out, inp, out_splits, in_splits) -> tuple[list[int], list[int]]:
    """Check all_to_all's tensors and splits; returns (out_splits, in_splits) as lists."""
    common.check_tensor(ctx, out, "all_to_all: out")
    common.check_tensor(ctx, inp, "all_to_all: inp")
    common.check_same_dtype(out, inp, "all_to_all: out and inp")
    if out.dim() == 0 or inp.dim() == 0 or out.shape[1:] != inp.shape[1:]:
        raise ValueError(f"all_to_all: out and inp must be at least 1-D with the same shape "
                         f"after dim 0, got {list(out.shape)} and {list(inp.shape)}")
    out_splits = splits(ctx, out, out_splits, "out")
    in_splits = splits(ctx, inp, in_splits, "in")
    check_no_overlap(out, inp)
    return out_splits, in_splits
