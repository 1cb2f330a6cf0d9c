"""The five collectives as torch custom ops: the in-place forms (all_reduce_, ...), the
functional ones (a new output; differentiable, gradients as the package docstring says),
their Python API (all_reduce(ctx, t), ...) and the stand-ins Dynamo traces in place of
trident.ccl's eager entries."""
from __future__ import annotations

from typing import Optional

import torch

from ... import ccl as _ccl
from ...runtime.compiled import STANDINS
from .common import LIB as _LIB, context, no_launch_options as _no_launch_options, op as _op


# ---------------------------------------------------------------------------- custom ops
@torch.library.custom_op(_LIB + "all_reduce_", mutates_args=("t",))
def all_reduce_(t: torch.Tensor, group: str, op: str = "sum",
                algorithm: Optional[str] = None) -> None:
    _ccl.all_reduce(context(group), t, op, algorithm)


@all_reduce_.register_fake
def _(t, group, op="sum", algorithm=None):
    return None


@torch.library.custom_op(_LIB + "all_gather_into", mutates_args=("out",))
def all_gather_into(out: torch.Tensor, inp: torch.Tensor, group: str,
                    algorithm: Optional[str] = None) -> None:
    _ccl.all_gather(context(group), out, inp, algorithm)


@all_gather_into.register_fake
def _(out, inp, group, algorithm=None):
    return None


@torch.library.custom_op(_LIB + "reduce_scatter_into", mutates_args=("out",))
def reduce_scatter_into(out: torch.Tensor, inp: torch.Tensor, group: str, op: str = "sum",
                        algorithm: Optional[str] = None) -> None:
    _ccl.reduce_scatter(context(group), out, inp, op, algorithm)


@reduce_scatter_into.register_fake
def _(out, inp, group, op="sum", algorithm=None):
    return None


@torch.library.custom_op(_LIB + "all_to_all_into", mutates_args=("out",))
def all_to_all_into(out: torch.Tensor, inp: torch.Tensor, out_splits: Optional[list[int]],
                    in_splits: Optional[list[int]], group: str,
                    algorithm: Optional[str] = None) -> None:
    _ccl.all_to_all(context(group), out, inp, out_splits, in_splits, algorithm)


@all_to_all_into.register_fake
def _(out, inp, out_splits, in_splits, group, algorithm=None):
    return None


@torch.library.custom_op(_LIB + "broadcast_", mutates_args=("t",))
def broadcast_(t: torch.Tensor, src: int, group: str, algorithm: Optional[str] = None) -> None:
    _ccl.broadcast(context(group), t, src, algorithm)


@broadcast_.register_fake
def _(t, src, group, algorithm=None):
    return None


# functional forms: a new output, computed by the in-place entry on it
@torch.library.custom_op(_LIB + "all_reduce", mutates_args=())
def all_reduce_out(t: torch.Tensor, group: str, op: str = "sum",
                   algorithm: Optional[str] = None) -> torch.Tensor:
    out = t.clone(memory_format=torch.contiguous_format)
    _ccl.all_reduce(context(group), out, op, algorithm)
    return out


@all_reduce_out.register_fake
def _(t, group, op="sum", algorithm=None):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _gathered_shape(inp, world: int):
    return (world * inp.shape[0], *inp.shape[1:])


@torch.library.custom_op(_LIB + "all_gather", mutates_args=())
def all_gather_out(inp: torch.Tensor, group: str,
                   algorithm: Optional[str] = None) -> torch.Tensor:
    ctx = context(group)
    out = inp.new_empty(_gathered_shape(inp, ctx.world_size))
    _ccl.all_gather(ctx, out, inp.contiguous(), algorithm)
    return out


@all_gather_out.register_fake
def _(inp, group, algorithm=None):
    return inp.new_empty(_gathered_shape(inp, context(group).world_size))


def _scattered_shape(inp, world: int):
    return (inp.shape[0] // world, *inp.shape[1:])


@torch.library.custom_op(_LIB + "reduce_scatter", mutates_args=())
def reduce_scatter_out(inp: torch.Tensor, group: str, op: str = "sum",
                       algorithm: Optional[str] = None) -> torch.Tensor:
    ctx = context(group)
    out = inp.new_empty(_scattered_shape(inp, ctx.world_size))
    _ccl.reduce_scatter(ctx, out, inp.contiguous(), op, algorithm)
    return out


@reduce_scatter_out.register_fake
def _(inp, group, op="sum", algorithm=None):
    return inp.new_empty(_scattered_shape(inp, context(group).world_size))


def _a2a_shape(inp, out_splits):
    rows = inp.shape[0] if out_splits is None else sum(out_splits)
    return (rows, *inp.shape[1:])


@torch.library.custom_op(_LIB + "all_to_all", mutates_args=())
def all_to_all_out(inp: torch.Tensor, out_splits: Optional[list[int]],
                   in_splits: Optional[list[int]], group: str,
                   algorithm: Optional[str] = None) -> torch.Tensor:
    out = inp.new_empty(_a2a_shape(inp, out_splits))
    _ccl.all_to_all(context(group), out, inp.contiguous(), out_splits, in_splits, algorithm)
    return out


@all_to_all_out.register_fake
def _(inp, out_splits, in_splits, group, algorithm=None):
    return inp.new_empty(_a2a_shape(inp, out_splits))


@torch.library.custom_op(_LIB + "broadcast", mutates_args=())
def broadcast_out(t: torch.Tensor, src: int, group: str,
                  algorithm: Optional[str] = None) -> torch.Tensor:
    out = t.clone(memory_format=torch.contiguous_format)
    _ccl.broadcast(context(group), out, src, algorithm)
    return out


@broadcast_out.register_fake
def _(t, src, group, algorithm=None):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


# ---------------------------------------------------------------------------- autograd
def _setup(ctx, inputs, output):
    ctx.inputs = [None if isinstance(i, torch.Tensor) else i for i in inputs]


def _need_sum(op: str, name: str) -> None:
    if op != "sum":
        raise RuntimeError(f"trident::{name}: only op='sum' is differentiable, got {op!r}")


def _all_reduce_bwd(ctx, grad):
    _, group, op, algorithm = ctx.inputs
    _need_sum(op, "all_reduce")
    return _op("all_reduce")(grad, group, "sum", algorithm), None, None, None


def _all_gather_bwd(ctx, grad):
    _, group, algorithm = ctx.inputs
    return _op("reduce_scatter")(grad.contiguous(), group, "sum", algorithm), None, None


def _reduce_scatter_bwd(ctx, grad):
    _, group, op, algorithm = ctx.inputs
    _need_sum(op, "reduce_scatter")
    return _op("all_gather")(grad.contiguous(), group, algorithm), None, None, None


def _all_to_all_bwd(ctx, grad):
    _, out_splits, in_splits, group, algorithm = ctx.inputs
    back = _op("all_to_all")(grad.contiguous(), in_splits, out_splits, group, algorithm)
    return back, None, None, None, None


def _broadcast_bwd(ctx, grad):
    _, src, group, algorithm = ctx.inputs
    total = _op("all_reduce")(grad, group, "sum", algorithm)
    if context(group).rank != src:
        total = torch.zeros_like(total)
    return total, None, None, None


for _name, _bwd in (("all_reduce", _all_reduce_bwd), ("all_gather", _all_gather_bwd),
                    ("reduce_scatter", _reduce_scatter_bwd), ("all_to_all", _all_to_all_bwd),
                    ("broadcast", _broadcast_bwd)):
    torch.library.register_autograd(_LIB + _name, _bwd, setup_context=_setup)


# ---------------------------------------------------------------------------- Python API
def all_reduce(ctx, t, op: str = "sum", algorithm: str | None = None) -> torch.Tensor:
    """Functional, differentiable all_reduce: a new tensor (t is left as it is)."""
    return torch.ops.trident.all_reduce(t, ctx.name, op, algorithm)


def all_gather(ctx, inp, algorithm: str | None = None) -> torch.Tensor:
    """Functional all_gather along dim 0: [world*n, ...]."""
    return torch.ops.trident.all_gather(inp, ctx.name, algorithm)


def reduce_scatter(ctx, inp, op: str = "sum", algorithm: str | None = None) -> torch.Tensor:
    """Functional reduce_scatter along dim 0: [n, ...] of [world*n, ...]."""
    return torch.ops.trident.reduce_scatter(inp, ctx.name, op, algorithm)


def all_to_all(ctx, inp, out_splits=None, in_splits=None,
               algorithm: str | None = None) -> torch.Tensor:
    """Functional all_to_all (rows; splits as in ctx.all_to_all)."""
    return torch.ops.trident.all_to_all(inp, None if out_splits is None else list(out_splits),
                                        None if in_splits is None else list(in_splits),
                                        ctx.name, algorithm)


def broadcast(ctx, t, src: int = 0, algorithm: str | None = None) -> torch.Tensor:
    return torch.ops.trident.broadcast(t, src, ctx.name, algorithm)


# ---------------------------------------------------------------------------- torch.compile
# What Dynamo traces in place of trident.ccl's eager entries (trident/runtime/compiled.py).
# Each checks what the graph cannot carry (launch options, knobs) and calls the op.
def _compiled_all_reduce(ctx, t, op="sum", algorithm=None, block=None, programs=None, **kw):
    _no_launch_options("all_reduce", block, programs, kw)
    torch.ops.trident.all_reduce_(t, ctx.name, op, algorithm)
    return t


def _compiled_all_gather(ctx, out, inp, algorithm=None, block=None, programs=None, **kw):
    _no_launch_options("all_gather", block, programs, kw)
    torch.ops.trident.all_gather_into(out, inp, ctx.name, algorithm)
    return out


def _compiled_reduce_scatter(ctx, out, inp, op="sum", algorithm=None, block=None,
                             programs=None, **kw):
    _no_launch_options("reduce_scatter", block, programs, kw)
    torch.ops.trident.reduce_scatter_into(out, inp, ctx.name, op, algorithm)
    return out


def _compiled_all_to_all(ctx, out, inp, out_splits=None, in_splits=None, algorithm=None,
                         block=None, programs=None, **kw):
    _no_launch_options("all_to_all", block, programs, kw)
    torch.ops.trident.all_to_all_into(
        out, inp, None if out_splits is None else list(out_splits),
        None if in_splits is None else list(in_splits), ctx.name, algorithm)
    return out


def _compiled_broadcast(ctx, t, src=0, algorithm=None, block=None, programs=None, **kw):
    _no_launch_options("broadcast", block, programs, kw)
    torch.ops.trident.broadcast_(t, src, ctx.name, algorithm)
    return t


STANDINS.update(all_reduce=_compiled_all_reduce, all_gather=_compiled_all_gather,
                reduce_scatter=_compiled_reduce_scatter, all_to_all=_compiled_all_to_all,
                broadcast=_compiled_broadcast)
