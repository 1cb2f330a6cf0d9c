"""Collectives over a world of several nodes (trident.WorldContext, trident/nodes/world.py),
with the same meaning as on one node: inside a node trident's kernels on the node's heap,
between nodes torch.distributed on the rails (one file per op). The inputs are checked as
on one node, with the same messages; then `algorithm` ("auto", "hierarchical" or "nccl":
one torch.distributed collective over the whole world) picks the path, "auto" through
cost.select (the cost model, trident/nodes/cost.py). all_to_all with uneven splits always
takes the flat path (all_to_all.py says why).

No launch plans here: each call makes its checks and its selection again (a few us of
host time) and then the node steps, which have their plans. CUDA graphs: the node steps
are trident's capturable kernels and the rail steps NCCL calls on the current stream, so
a call with even sizes can be captured after an eager warm-up (which creates the node
buffers); where ranks share a GPU the rail goes through the host and cannot be.
"""
from __future__ import annotations

import math

from ...ccl import _check_splits_agree, checks, nccl
from .all_gather import all_gather as _all_gather
from .all_reduce import all_reduce as _all_reduce
from .all_to_all import all_to_all as _all_to_all, flat as _all_to_all_flat
from .broadcast import broadcast as _broadcast
from .reduce_scatter import reduce_scatter as _reduce_scatter
from .. import cost, rail

ALGORITHMS = ("hierarchical", "nccl")


def _algorithm(wctx, op: str, algorithm, nbytes: int) -> str:
    has_nccl = nccl.available(wctx)
    if algorithm is None or algorithm == "auto":
        topo = wctx.topology
        return cost.select(op, nbytes, topo.num_nodes, topo.node_size, has_nccl,
                           cost.internode(wctx.options))
    choices = ["auto", "hierarchical"] + (["nccl"] if has_nccl else [])
    if algorithm == "nccl":
        nccl.check_available(wctx, f"{op}: algorithm 'nccl'", choices)
    elif algorithm != "hierarchical":
        raise ValueError(f"{op}: on a context across nodes the algorithm is one of {choices} "
                         f"(the node's own algorithms run inside each node), got {algorithm!r}")
    return algorithm


def _no_options(op: str, options: dict) -> None:
    if options:
        raise TypeError(f"{op}: a context across nodes takes no launch options, got "
                        f"{sorted(options)}; the node steps choose their own (use "
                        f"ctx.node.{op}(...) for one node's ranks)")


# (flat, hierarchical) implementation of each op, both called as fn(wctx, *args)
_PATHS = {"all_reduce": (nccl.all_reduce, _all_reduce),
          "all_gather": (nccl.all_gather, _all_gather),
          "reduce_scatter": (nccl.reduce_scatter, _reduce_scatter),
          "broadcast": (nccl.broadcast, _broadcast)}


def _run(wctx, op: str, algorithm, sized, *args) -> None:
    """Select by the bytes of `sized` (the selector's bytes per rank), then run op(*args)
    unless `sized` is empty (then so is the whole call, on every rank)."""
    name = _algorithm(wctx, op, algorithm, sized.numel() * sized.element_size())
    if sized.numel():
        _PATHS[op][name == "hierarchical"](wctx, *args)


def all_reduce(wctx, t, op: str = "sum", algorithm: str = "auto", **options):
    """In place: t = op over every rank of the world of t. Returns t."""
    _no_options("all_reduce", options)
    checks.all_reduce(wctx, t, op)
    _run(wctx, "all_reduce", algorithm, t, t, op)
    return t


def all_gather(wctx, out, inp, algorithm: str = "auto", **options):
    """out [world*n, ...] = every rank's inp [n, ...], in world rank order. Returns out."""
    _no_options("all_gather", options)
    checks.all_gather(wctx, out, inp)
    _run(wctx, "all_gather", algorithm, inp, out, inp)
    return out


def reduce_scatter(wctx, out, inp, op: str = "sum", algorithm: str = "auto", **options):
    """out [n, ...] = this rank's block of the op over the world of inp [world*n, ...]."""
    _no_options("reduce_scatter", options)
    checks.reduce_scatter(wctx, out, inp, op)
    _run(wctx, "reduce_scatter", algorithm, out, out, inp, op)
    return out


def broadcast(wctx, t, src: int = 0, algorithm: str = "auto", **options):
    """t on every rank = t of world rank `src`. Returns t."""
    _no_options("broadcast", options)
    checks.broadcast(wctx, t, src)
    _run(wctx, "broadcast", algorithm, t, t, src)
    return t


def all_to_all(wctx, out, inp, out_splits=None, in_splits=None, algorithm: str = "auto",
               **options):
    """Rank r sends rows in_splits[p] of inp to world rank p and receives out_splits[p]
    rows from rank p into out, in world rank order. None = even splits."""
    _no_options("all_to_all", options)
    even = out_splits is None and in_splits is None
    out_splits, in_splits = checks.all_to_all(wctx, out, inp, out_splits, in_splits)
    # uneven splits differ between ranks: every rank must still take the same path
    name = _algorithm(wctx, "all_to_all", algorithm,
                      inp.numel() * inp.element_size() if even else 1 << 62)
    if not even or name == "nccl":
        if wctx.debug:
            _check_splits_agree(wctx, out_splits, in_splits)
        if math.prod(inp.shape[1:]):              # every rank joins, with rows or none
            _all_to_all_flat(wctx, out, inp, out_splits, in_splits)
        return out
    if inp.numel():
        _all_to_all(wctx, out, inp)
    return out


__all__ = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all",
           "ALGORITHMS", "cost", "rail"]
