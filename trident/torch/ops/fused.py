"""The fused ops as torch custom ops: the three GEMM + communication ops (functional,
differentiable through plain ops) with their options, all-reduce + residual add + RMSNorm
and GEMM + all-reduce + residual add + RMSNorm (in-place and functional, no autograd);
their Python API and the stand-ins Dynamo traces in place of trident.ops' and
ccl.all_reduce_add_rmsnorm's eager entries."""
from __future__ import annotations

import ast
import functools
from typing import Optional

import torch

from ... import ccl as _ccl
from ... import ops as _ops
from ...runtime.compiled import STANDINS
from .common import LIB as _LIB, context, no_launch_options as _no_launch_options, op as _op


# ---------------------------------------------------------------------------- GEMM + communication
# The fused ops' options (gemm=, config=, split_k=, num_pushers=: trident/ops) travel as one
# string, the repr of a dict of Python literals, so that a compiled graph can force a GEMM
# core or config family as an eager call does; None: no options.
_OPTION_TYPES = (bool, int, float, str, type(None))


def _encode_options(name: str, options: dict) -> Optional[str]:
    if not options:
        return None
    for key, value in options.items():
        values = value.values() if isinstance(value, dict) else (value,)
        if not all(isinstance(v, _OPTION_TYPES) for v in values):
            raise TypeError(f"{name}: option {key}={value!r} cannot go through "
                            f"torch.compile: options must be ints, floats, bools, strings "
                            f"or dicts of them")
    return repr(dict(sorted(options.items())))


@functools.lru_cache(maxsize=256)
def _decode_options(options: str) -> dict:
    return ast.literal_eval(options)


def _fused(name: str, fn, shape):
    @torch.library.custom_op(_LIB + name, mutates_args=())
    def impl(a: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], group: str,
             algorithm: str = "auto", options: Optional[str] = None) -> torch.Tensor:
        kwargs = {} if options is None else _decode_options(options)
        return fn(context(group), a, w, bias, algorithm=algorithm, **kwargs)

    @impl.register_fake
    def _(a, w, bias, group, algorithm="auto", options=None):
        return a.new_empty(shape(a, w, context(group).world_size))

    return impl


all_gather_matmul_out = _fused("all_gather_matmul", _ops.all_gather_matmul,
                               lambda a, w, world: (world * a.shape[0], w.shape[0]))
matmul_reduce_scatter_out = _fused("matmul_reduce_scatter", _ops.matmul_reduce_scatter,
                                   lambda a, w, world: (a.shape[0] // world, w.shape[0]))
matmul_all_reduce_out = _fused("matmul_all_reduce", _ops.matmul_all_reduce,
                               lambda a, w, world: (a.shape[0], w.shape[0]))


# ---------------------------------------------------------------------------- all-reduce + RMSNorm
# trident::all_reduce_add_rmsnorm_(x, Tensor(a!) residual, weight, eps, group, algorithm)
#     -> out: residual += all-reduce sum of x (in place), out = rmsnorm(residual) * weight
# trident::all_reduce_add_rmsnorm(x, residual, weight, eps, group, algorithm)
#     -> (out, new residual): the functional form (residual left as it is). No autograd.
@torch.library.custom_op(_LIB + "all_reduce_add_rmsnorm_", mutates_args=("residual",))
def all_reduce_add_rmsnorm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float, group: str,
                            algorithm: Optional[str] = None) -> torch.Tensor:
    return _ccl.all_reduce_add_rmsnorm(context(group), x.contiguous(), residual, weight, eps,
                                       algorithm=algorithm)


@all_reduce_add_rmsnorm_.register_fake
def _(x, residual, weight, eps, group, algorithm=None):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op(_LIB + "all_reduce_add_rmsnorm", mutates_args=())
def all_reduce_add_rmsnorm_out(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                               eps: float, group: str, algorithm: Optional[str] = None
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    new_residual = residual.clone(memory_format=torch.contiguous_format)
    out = _ccl.all_reduce_add_rmsnorm(context(group), x.contiguous(), new_residual, weight,
                                      eps, algorithm=algorithm)
    return out, new_residual


@all_reduce_add_rmsnorm_out.register_fake
def _(x, residual, weight, eps, group, algorithm=None):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(residual, memory_format=torch.contiguous_format))


def all_reduce_add_rmsnorm(ctx, x, residual, weight, eps: float = 1e-6,
                           algorithm: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Functional fused all-reduce + residual add + RMSNorm: (out, new residual)."""
    return torch.ops.trident.all_reduce_add_rmsnorm(x, residual, weight, float(eps), ctx.name,
                                                    algorithm)


# ---------------------------------------------------------------------------- GEMM + all-reduce + RMSNorm
# trident::matmul_all_reduce_add_rmsnorm(a, w, residual, norm_weight, eps, bias, group,
#     schedule, options) -> (out, res): res = all_reduce(a @ w.T) + bias + residual (a new
#     tensor; residual left as it is), out = rmsnorm(res) * norm_weight. No autograd.
# trident::matmul_all_reduce_add_rmsnorm_(..., Tensor(a!) residual, ...) -> out: the same
#     with residual updated in place (residual_out=residual).
def _norm_call(group, a, w, residual, norm_weight, eps, bias, schedule, options, **kw):
    kwargs = {} if options is None else _decode_options(options)
    return _ops.matmul_all_reduce_add_rmsnorm(context(group), a, w, residual, norm_weight,
                                              eps, bias=bias, schedule=schedule, **kw,
                                              **kwargs)


@torch.library.custom_op(_LIB + "matmul_all_reduce_add_rmsnorm", mutates_args=())
def matmul_all_reduce_add_rmsnorm_out(
        a: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
        eps: float, bias: Optional[torch.Tensor], group: str, schedule: str = "auto",
        options: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    return _norm_call(group, a, w, residual, norm_weight, eps, bias, schedule, options)


@matmul_all_reduce_add_rmsnorm_out.register_fake
def _(a, w, residual, norm_weight, eps, bias, group, schedule="auto", options=None):
    shape = (a.shape[0], w.shape[0])
    return a.new_empty(shape), a.new_empty(shape)


@torch.library.custom_op(_LIB + "matmul_all_reduce_add_rmsnorm_", mutates_args=("residual",))
def matmul_all_reduce_add_rmsnorm_(
        a: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
        eps: float, bias: Optional[torch.Tensor], group: str, schedule: str = "auto",
        options: Optional[str] = None) -> torch.Tensor:
    return _norm_call(group, a, w, residual, norm_weight, eps, bias, schedule, options,
                      residual_out=residual)[0]


@matmul_all_reduce_add_rmsnorm_.register_fake
def _(a, w, residual, norm_weight, eps, bias, group, schedule="auto", options=None):
    return a.new_empty((a.shape[0], w.shape[0]))


def matmul_all_reduce_add_rmsnorm(ctx, a, w, residual, norm_weight, eps: float = 1e-6,
                                  bias=None, schedule: str = "auto", **options):
    """Functional GEMM + all-reduce + residual add + RMSNorm: (out, res), residual left as
    it is (see ctx.matmul_all_reduce_add_rmsnorm)."""
    return torch.ops.trident.matmul_all_reduce_add_rmsnorm(
        a, w, residual, norm_weight, float(eps), bias, ctx.name, schedule,
        _encode_options("matmul_all_reduce_add_rmsnorm", options))


def _compiled_matmul_norm(ctx, a, w, residual, norm_weight, eps=1e-6, bias=None, out=None,
                          residual_out=None, schedule="auto", **options):
    encoded = _encode_options("matmul_all_reduce_add_rmsnorm", options)
    if residual_out is residual:
        y = torch.ops.trident.matmul_all_reduce_add_rmsnorm_(
            a, w, residual, norm_weight, float(eps), bias, ctx.name, schedule, encoded)
        res = residual
    else:
        y, res = torch.ops.trident.matmul_all_reduce_add_rmsnorm(
            a, w, residual, norm_weight, float(eps), bias, ctx.name, schedule, encoded)
        if residual_out is not None:
            res = residual_out.copy_(res)
    return (y if out is None else out.copy_(y)), res


# ---------------------------------------------------------------------------- autograd
def _setup_fused(ctx, inputs, output):
    a, w, bias, group = inputs[:4]
    ctx.save_for_backward(a, w)
    ctx.group, ctx.bias_dtype = group, None if bias is None else bias.dtype


def _linear_grads(ctx, g, a_full):
    """da (of a_full), dw, dbias of y = a_full @ w.T + bias for the output gradient g."""
    _, w = ctx.saved_tensors
    da = g @ w if ctx.needs_input_grad[0] else None
    dw = g.t() @ a_full if ctx.needs_input_grad[1] else None
    db = g.sum(0).to(ctx.bias_dtype) if ctx.bias_dtype is not None and ctx.needs_input_grad[2] \
        else None
    return da, dw, db


def _all_gather_matmul_bwd(ctx, grad):
    a, _ = ctx.saved_tensors
    gathered = _op("all_gather")(a.contiguous(), ctx.group, None)
    da_full, dw, db = _linear_grads(ctx, grad, gathered)
    da = None if da_full is None else _op("reduce_scatter")(da_full.contiguous(), ctx.group,
                                                            "sum", None)
    return da, dw, db, None, None, None


def _row_parallel_bwd(gather):
    def backward(ctx, grad):
        a, _ = ctx.saved_tensors
        g = _op("all_gather")(grad.contiguous(), ctx.group, None) if gather \
            else _op("all_reduce")(grad, ctx.group, "sum", None)
        da, dw, db = _linear_grads(ctx, g, a)
        return da, dw, db, None, None, None
    return backward


for _name, _bwd in (("all_gather_matmul", _all_gather_matmul_bwd),
                    ("matmul_reduce_scatter", _row_parallel_bwd(gather=True)),
                    ("matmul_all_reduce", _row_parallel_bwd(gather=False))):
    torch.library.register_autograd(_LIB + _name, _bwd, setup_context=_setup_fused)


# ---------------------------------------------------------------------------- Python API
# schedule= (or its older alias algorithm=) by name; given the context, a bad one is handed
# to the peers too (ctx.fail_call), as the eager entries do
_schedule = _ops.schedules.normalize


def all_gather_matmul(ctx, a, w, bias=None, schedule: str = "auto",
                      algorithm: str | None = None, **options) -> torch.Tensor:
    """Functional, differentiable all_gather(a) @ w.T + bias (see ctx.all_gather_matmul)."""
    return torch.ops.trident.all_gather_matmul(
        a, w, bias, ctx.name, _schedule("all_gather_matmul", schedule, algorithm, ctx),
        _encode_options("all_gather_matmul", options))


def matmul_reduce_scatter(ctx, a, w, bias=None, schedule: str = "auto",
                          algorithm: str | None = None, **options) -> torch.Tensor:
    """Functional, differentiable reduce_scatter(a @ w.T) + bias."""
    return torch.ops.trident.matmul_reduce_scatter(
        a, w, bias, ctx.name, _schedule("matmul_reduce_scatter", schedule, algorithm, ctx),
        _encode_options("matmul_reduce_scatter", options))


def matmul_all_reduce(ctx, a, w, bias=None, schedule: str = "auto",
                      algorithm: str | None = None, **options) -> torch.Tensor:
    """Functional, differentiable all_reduce(a @ w.T) + bias."""
    return torch.ops.trident.matmul_all_reduce(
        a, w, bias, ctx.name, _schedule("matmul_all_reduce", schedule, algorithm, ctx),
        _encode_options("matmul_all_reduce", options))


# ---------------------------------------------------------------------------- torch.compile
def _compiled_add_rmsnorm(ctx, x, residual, weight, eps=1e-6, out=None, algorithm="auto",
                          block=None, programs=None):
    _no_launch_options("all_reduce_add_rmsnorm", block, programs)
    y = torch.ops.trident.all_reduce_add_rmsnorm_(x, residual, weight, float(eps), ctx.name,
                                                  algorithm)
    return y if out is None else out.copy_(y)


def _compiled_fused(name):
    def run(ctx, a, w, bias=None, out=None, schedule="auto", algorithm=None, **options):
        y = getattr(torch.ops.trident, name)(a, w, bias, ctx.name,
                                             _schedule(name, schedule, algorithm),
                                             _encode_options(name, options))
        return y if out is None else out.copy_(y)
    return run


STANDINS.update({
    "all_reduce_add_rmsnorm": _compiled_add_rmsnorm,
    "all_gather_matmul": _compiled_fused("all_gather_matmul"),
    "matmul_reduce_scatter": _compiled_fused("matmul_reduce_scatter"),
    "matmul_all_reduce": _compiled_fused("matmul_all_reduce"),
    "matmul_all_reduce_add_rmsnorm": _compiled_matmul_norm})
