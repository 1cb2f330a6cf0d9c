"""Collectives over the symmetric heap: all_gather, reduce_scatter, all_reduce,
all_to_all, broadcast (called as ctx.all_gather(...) etc.).

Every function checks its inputs, picks an algorithm (`algorithm=` by name, else
selector.TABLE by size and world size; "nccl" = torch.distributed) and launches one
kernel, stream-ordered and CUDA-graph capturable. `block` and `programs` override the
launch size (tests use them). In debug mode (ctx.debug) the ranks also check that they
called with the same sizes, and every op is synchronised and checked for timeouts.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from . import common, nccl
from .all_gather import ALGORITHMS as ALL_GATHER
from .all_reduce import ALGORITHMS as ALL_REDUCE
from .all_to_all import ALGORITHMS as ALL_TO_ALL
from .broadcast import ALGORITHMS as BROADCAST
from .reduce_scatter import ALGORITHMS as REDUCE_SCATTER
from .selector import select

ALGORITHMS = {"all_gather": ALL_GATHER, "reduce_scatter": REDUCE_SCATTER,
              "all_reduce": ALL_REDUCE, "all_to_all": ALL_TO_ALL, "broadcast": BROADCAST}


def _algorithm(ctx, op: str, algorithm, nbytes: int) -> str:
    name = algorithm or select(op, nbytes, ctx.world_size)
    if name != "nccl" and name not in ALGORITHMS[op]:
        raise ValueError(f"{op}: unknown algorithm {name!r}; choose one of "
                         f"{sorted(ALGORITHMS[op]) + ['nccl']}")
    return name


def _agree(ctx, op: str, *signature) -> None:
    """Debug mode: raise ValueError if the ranks called `op` with different sizes."""
    if not ctx.debug:
        return
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, signature, group=ctx.group)
    for rank, theirs in enumerate(everyone):
        if theirs != signature:
            raise ValueError(f"{op}: rank {ctx.rank} called with {signature} but rank {rank} "
                             f"with {theirs}; every rank must pass the same sizes")


def _done(ctx):
    ctx.after_op()


def all_reduce(ctx, t, op: str = "sum", algorithm: str | None = None, block=None, programs=None):
    """In place: t = op over ranks of t (fp32 accumulation). Returns t."""
    common.check_tensor(ctx, t, "all_reduce: t")
    code = common.check_reduce(t, "all_reduce: t", op)
    name = _algorithm(ctx, "all_reduce", algorithm, t.numel() * t.element_size())
    _agree(ctx, "all_reduce", tuple(t.shape), str(t.dtype), op, name)
    if name == "nccl":
        nccl.all_reduce(ctx, t, op)
    elif ctx.world_size > 1 and t.numel():
        ALL_REDUCE[name](ctx, t, code, block=block, programs=programs)
    _done(ctx)
    return t


def all_gather(ctx, out, inp, algorithm: str | None = None, block=None, programs=None):
    """out [world*n, ...] = every rank's inp [n, ...], in rank order. Returns out."""
    common.check_tensor(ctx, out, "all_gather: out")
    common.check_tensor(ctx, inp, "all_gather: inp")
    common.check_same_dtype(out, inp, "all_gather: out and inp")
    if inp.dim() == 0 or tuple(out.shape) != (ctx.world_size * inp.shape[0], *inp.shape[1:]):
        raise ValueError(f"all_gather: out must have shape [world_size * n, ...] = "
                         f"{[ctx.world_size * inp.shape[0], *inp.shape[1:]] if inp.dim() else '?'}"
                         f" for inp of shape {list(inp.shape)}, got {list(out.shape)}")
    name = _algorithm(ctx, "all_gather", algorithm, inp.numel() * inp.element_size())
    _agree(ctx, "all_gather", tuple(inp.shape), str(inp.dtype), name)
    if name == "nccl":
        nccl.all_gather(ctx, out, inp)
    elif ctx.world_size == 1:
        out.copy_(inp)
    else:
        words_out, words_in = common.as_words(out, inp)
        ALL_GATHER[name](ctx, words_out, words_in, block=block, programs=programs)
    _done(ctx)
    return out


def reduce_scatter(ctx, out, inp, op: str = "sum", algorithm: str | None = None, block=None,
                   programs=None):
    """out [n, ...] = this rank's block of the op over ranks of inp [world*n, ...]."""
    common.check_tensor(ctx, out, "reduce_scatter: out")
    common.check_tensor(ctx, inp, "reduce_scatter: inp")
    common.check_same_dtype(out, inp, "reduce_scatter: out and inp")
    code = common.check_reduce(inp, "reduce_scatter: inp", op)
    if out.dim() == 0 or tuple(inp.shape) != (ctx.world_size * out.shape[0], *out.shape[1:]):
        raise ValueError(f"reduce_scatter: inp must have shape [world_size * n, ...] for out "
                         f"of shape [n, ...] = {list(out.shape)}, got {list(inp.shape)}")
    name = _algorithm(ctx, "reduce_scatter", algorithm, out.numel() * out.element_size())
    _agree(ctx, "reduce_scatter", tuple(out.shape), str(out.dtype), op, name)
    if name == "nccl":
        nccl.reduce_scatter(ctx, out, inp, op)
    elif ctx.world_size == 1:
        out.copy_(inp)
    elif out.numel():
        REDUCE_SCATTER[name](ctx, out, inp, code, block=block, programs=programs)
    _done(ctx)
    return out


def _splits(ctx, t, splits, name: str) -> list[int]:
    rows = t.shape[0]
    if splits is None:
        if rows % ctx.world_size:
            raise ValueError(f"all_to_all: {name} has {rows} rows, not a multiple of world size "
                             f"{ctx.world_size}; pass {name}_splits for uneven splits")
        return [rows // ctx.world_size] * ctx.world_size
    splits = [int(s) for s in splits]
    if len(splits) != ctx.world_size or min(splits) < 0 or sum(splits) != rows:
        raise ValueError(f"all_to_all: {name}_splits must be {ctx.world_size} non-negative "
                         f"row counts summing to {name}.shape[0] = {rows}, got {splits}")
    return splits


def all_to_all(ctx, out, inp, out_splits=None, in_splits=None, algorithm: str | None = None,
               block=None, programs=None):
    """Rank r sends rows in_splits[p] of inp (in order) to rank p, and receives
    out_splits[p] rows from rank p into out (in rank order). None = even splits."""
    common.check_tensor(ctx, out, "all_to_all: out")
    common.check_tensor(ctx, inp, "all_to_all: inp")
    common.check_same_dtype(out, inp, "all_to_all: out and inp")
    if out.dim() == 0 or inp.dim() == 0 or out.shape[1:] != inp.shape[1:]:
        raise ValueError(f"all_to_all: out and inp must be at least 1-D with the same shape "
                         f"after dim 0, got {list(out.shape)} and {list(inp.shape)}")
    out_splits = _splits(ctx, out, out_splits, "out")
    in_splits = _splits(ctx, inp, in_splits, "in")
    name = _algorithm(ctx, "all_to_all", algorithm, inp.numel() * inp.element_size())
    _agree(ctx, "all_to_all", tuple(inp.shape[1:]), str(inp.dtype), name)
    if name == "nccl":
        if ctx.debug:
            _check_splits_agree(ctx, out_splits, in_splits)
        nccl.all_to_all(ctx, out, inp, out_splits, in_splits)
    elif ctx.world_size == 1:
        out.copy_(inp)
    else:
        row_bytes = math.prod(inp.shape[1:]) * inp.element_size()
        words_out, words_in = common.as_words(out, inp, unit=row_bytes)
        row = row_bytes // words_out.element_size()
        ALL_TO_ALL[name](ctx, words_out, words_in, out_splits, in_splits, row, block=block,
                         programs=programs)
        if ctx.debug:
            _check_splits_matched(ctx)
    _done(ctx)
    return out


def _check_splits_agree(ctx, out_splits, in_splits) -> None:
    """Debug mode, before a torch.distributed all_to_all: every rank checks the whole
    split matrix, so all raise together instead of some entering the collective."""
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, (list(out_splits), list(in_splits)), group=ctx.group)
    for src, (_, sends) in enumerate(everyone):
        for dst, (receives, _) in enumerate(everyone):
            if sends[dst] != receives[src]:
                raise ValueError(f"all_to_all: a rank's in_splits[p] differs from rank p's "
                                 f"out_splits for it (rank {src} sends {sends[dst]} rows to "
                                 f"rank {dst}, which expects {receives[src]})")


def _check_splits_matched(ctx) -> None:
    st = common.state(ctx)
    ctx.sync()
    bad = torch.tensor([int(st.a2a_check.item())], device=ctx.device)
    st.a2a_check.zero_()
    dist.all_reduce(bad, group=ctx.group)
    if bad.item():
        raise ValueError("all_to_all: a rank's in_splits[p] differs from rank p's out_splits "
                         "for it; the extra rows were dropped")


def broadcast(ctx, t, src: int = 0, algorithm: str | None = None, block=None, programs=None):
    """t on every rank = t of rank `src`. Returns t."""
    common.check_tensor(ctx, t, "broadcast: t")
    if not isinstance(src, int) or not 0 <= src < ctx.world_size:
        raise ValueError(f"broadcast: src must be a rank in 0..{ctx.world_size - 1}, got {src!r}")
    name = _algorithm(ctx, "broadcast", algorithm, t.numel() * t.element_size())
    _agree(ctx, "broadcast", tuple(t.shape), str(t.dtype), src, name)
    if name == "nccl":
        nccl.broadcast(ctx, t, src)
    elif ctx.world_size > 1 and t.numel():
        (words,) = common.as_words(t)
        BROADCAST[name](ctx, words, src, block=block, programs=programs)
    _done(ctx)
    return t


__all__ = ["all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast",
           "ALGORITHMS", "select"]
