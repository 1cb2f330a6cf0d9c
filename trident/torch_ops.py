"""trident as PyTorch custom ops (namespace "trident"): usable inside torch.compile,
CUDA graphs and autograd.

The ops find the rank's Context by its name (`ctx.name`, a string: the group's name, the
context's number and the world size), never by a Python object in the graph, as torch
symm-mem finds a group by `group_name`. Every Context registers itself on init
(trident/context.py) and leaves the registry on close; an ExpertParallel likewise (ep.name).

A name carries everything the ops' fake (meta) kernels read from the object it names (the
world size; an ExpertParallel's local experts, token capacity and hidden size): Inductor
keeps compiled graphs on disk (its FX graph and AOTAutograd caches, by default
/tmp/torchinductor_$USER, shared by every process of the user) under a key made of the
graph's code and its inputs' shapes, and a hit reuses the output shapes the fakes gave
when the graph was made. A job at another world size, whose graph has the same inputs and
the same names, would otherwise get that job's shapes (Inductor's assert_size_stride then
fails: "expected size 64==32 ... incorrect fake").

In-place forms (they mutate their first argument, as the eager calls do):
    trident::all_reduce_(Tensor(a!) t, str group, str op, str? algorithm)
    trident::all_gather_into(Tensor(a!) out, Tensor inp, str group, str? algorithm)
    trident::reduce_scatter_into(Tensor(a!) out, Tensor inp, str group, str op, str? algorithm)
    trident::all_to_all_into(Tensor(a!) out, Tensor inp, int[]? out_splits, int[]? in_splits,
                             str group, str? algorithm)
    trident::broadcast_(Tensor(a!) t, int src, str group, str? algorithm)
Functional forms (new output; differentiable where noted):
    trident::all_reduce(t, group, op, algorithm) -> Tensor          grad: all_reduce (sum)
    trident::all_gather(inp, group, algorithm) -> Tensor             grad: reduce_scatter
    trident::reduce_scatter(inp, group, op, algorithm) -> Tensor     grad: all_gather (sum)
    trident::all_to_all(inp, out_splits, in_splits, group, algorithm) -> Tensor
                                                                     grad: all_to_all back
    trident::broadcast(t, src, group, algorithm) -> Tensor           grad: summed to src
    trident::all_gather_matmul(a, w, bias, group, algorithm, options) -> Tensor
                                                                     grad: plain ops
    trident::matmul_reduce_scatter(a, w, bias, group, algorithm, options) -> Tensor
    trident::matmul_all_reduce(a, w, bias, group, algorithm, options) -> Tensor
      (options: None, or the repr of a dict of the op's keyword options -- gemm=,
      config=, split_k=, num_pushers= -- as an eager call takes them; algorithm: the
      schedule, trident/ops/schedules.py, which the Python API takes as schedule=)
    trident::moe_dispatch(x, topk_idx, topk_weights, ep) -> (expert_x, expert_num_tokens)
    trident::moe_combine(expert_y, topk_weights, ep, num_tokens) -> Tensor   (no grad)
    trident::all_reduce_add_rmsnorm(x, residual, weight, eps, group, algorithm)
                                           -> (out, new residual)     (no grad)
and trident::all_reduce_add_rmsnorm_(x, Tensor(a!) residual, weight, eps, group, algorithm)
-> out, the fused all-reduce + residual add + RMSNorm mutating its residual.

Gradients are those of the sum of every rank's loss (torch.distributed.nn's convention):
the gradient of all_reduce is the all_reduce of the gradients. A loss computed the same
on every rank (Megatron style) therefore gets world_size times its gradient; divide it by
the world size. A bias of the row-parallel ops must be the same on every rank (it is
added once), and gets the gradient of that one shared parameter.

The calls users make eagerly (ctx.all_reduce(t), ctx.all_gather(out, inp),
ctx.matmul_all_reduce(a, w), ...) work unchanged inside torch.compile(fullgraph=True):
this module registers, with torch.compiler.substitute_in_graph, a stand-in for each
trident.ccl / trident.ops entry that Dynamo traces instead of the entry (it calls the
custom op). Eager calls never see the stand-ins: they cost nothing there. The fused ops'
options (gemm=, config=, split_k=, num_pushers=) go through too, so that a compiled graph
can force a GEMM core or config family; the collectives' launch options (block,
programs, ...) raise a ValueError there.

The functions below (all_reduce(ctx, t), ...) are the differentiable functional forms
for model code, eager or compiled.
"""
from __future__ import annotations

import ast
import functools
import weakref
from typing import Optional

import torch

from . import ccl as _ccl
from . import ops as _ops

# ---------------------------------------------------------------------------- registry
_CONTEXTS: "weakref.WeakValueDictionary[str, object]" = weakref.WeakValueDictionary()
_EXPERT_PARALLEL: "weakref.WeakValueDictionary[str, object]" = weakref.WeakValueDictionary()


def register(ctx) -> None:
    """Make `ctx` findable by ctx.name (Context.__init__ calls this once it has named ctx;
    the name carries the world size, which the fakes read: see the module docstring)."""
    _CONTEXTS[ctx.name] = ctx


def unregister(ctx) -> None:
    if _CONTEXTS.get(ctx.name) is ctx:
        del _CONTEXTS[ctx.name]


def context(group: str):
    """The open Context named `group` in this process."""
    ctx = _CONTEXTS.get(group)
    if ctx is None:
        raise RuntimeError(f"trident: no open Context named {group!r} in this process (open: "
                           f"{sorted(_CONTEXTS)}); it was closed, or the graph was made by "
                           f"another process")
    return ctx


def register_expert_parallel(ep) -> str:
    """Name an ExpertParallel for trident::moe_dispatch/combine (ep.name): its context's
    name, its number in this process and what the fakes' shapes follow from (local experts,
    max_num_tokens -- the capacity is max_num_tokens * world -- and the hidden size)."""
    name = (f"{ep.ctx.name}/ep{ep._id}:local_experts{ep.num_local_experts}"
            f":max_tokens{ep.max_num_tokens}:hidden{ep.hidden_dim}")
    _EXPERT_PARALLEL[name] = ep
    return name


def expert_parallel(name: str):
    ep = _EXPERT_PARALLEL.get(name)
    if ep is None:
        raise RuntimeError(f"trident: no ExpertParallel named {name!r} in this process")
    return ep


_LIB = "trident::"


def _op(name: str):
    return getattr(torch.ops.trident, name).default


# ---------------------------------------------------------------------------- collectives
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


# ---------------------------------------------------------------------------- fused ops
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


# ---------------------------------------------------------------------------- MoE
@torch.library.custom_op(_LIB + "moe_dispatch", mutates_args=())
def moe_dispatch(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: Optional[torch.Tensor],
                 ep: str) -> tuple[torch.Tensor, torch.Tensor]:
    """ExpertParallel.dispatch as an op. The outputs are copies of the object's buffers
    (an op's outputs must be its own; the buffers are overwritten by the next dispatch)."""
    d = expert_parallel(ep).dispatch(x, topk_idx, topk_weights=topk_weights)
    return d.expert_x.clone(), d.expert_num_tokens.clone()


@moe_dispatch.register_fake
def _(x, topk_idx, topk_weights, ep):
    e = expert_parallel(ep)
    return (x.new_empty(e.num_local_experts, e.capacity, e.hidden_dim),
            x.new_empty(e.num_local_experts, dtype=torch.int32))


@torch.library.custom_op(_LIB + "moe_combine", mutates_args=())
def moe_combine(expert_y: torch.Tensor, topk_weights: Optional[torch.Tensor], ep: str,
                num_tokens: int) -> torch.Tensor:
    """ExpertParallel.combine of the object's latest dispatch (num_tokens: its T)."""
    e = expert_parallel(ep)
    d = e._result
    if d is None or d.num_tokens != num_tokens:
        raise ValueError(f"trident::moe_combine: the latest dispatch of {ep!r} had "
                         f"{None if d is None else d.num_tokens} tokens, not {num_tokens}")
    return e.combine(expert_y, d, topk_weights)


@moe_combine.register_fake
def _(expert_y, topk_weights, ep, num_tokens):
    return expert_y.new_empty(num_tokens, expert_parallel(ep).hidden_dim)


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


for _name, _bwd in (("all_reduce", _all_reduce_bwd), ("all_gather", _all_gather_bwd),
                    ("reduce_scatter", _reduce_scatter_bwd), ("all_to_all", _all_to_all_bwd),
                    ("broadcast", _broadcast_bwd)):
    torch.library.register_autograd(_LIB + _name, _bwd, setup_context=_setup)
for _name, _bwd in (("all_gather_matmul", _all_gather_matmul_bwd),
                    ("matmul_reduce_scatter", _row_parallel_bwd(gather=True)),
                    ("matmul_all_reduce", _row_parallel_bwd(gather=False))):
    torch.library.register_autograd(_LIB + _name, _bwd, setup_context=_setup_fused)


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


_schedule = _ops.schedules.normalize     # schedule= (or its older alias algorithm=) by name


def all_gather_matmul(ctx, a, w, bias=None, schedule: str = "auto",
                      algorithm: str | None = None, **options) -> torch.Tensor:
    """Functional, differentiable all_gather(a) @ w.T + bias (see ctx.all_gather_matmul)."""
    return torch.ops.trident.all_gather_matmul(
        a, w, bias, ctx.name, _schedule("all_gather_matmul", schedule, algorithm),
        _encode_options("all_gather_matmul", options))


def matmul_reduce_scatter(ctx, a, w, bias=None, schedule: str = "auto",
                          algorithm: str | None = None, **options) -> torch.Tensor:
    """Functional, differentiable reduce_scatter(a @ w.T) + bias."""
    return torch.ops.trident.matmul_reduce_scatter(
        a, w, bias, ctx.name, _schedule("matmul_reduce_scatter", schedule, algorithm),
        _encode_options("matmul_reduce_scatter", options))


def matmul_all_reduce(ctx, a, w, bias=None, schedule: str = "auto",
                      algorithm: str | None = None, **options) -> torch.Tensor:
    """Functional, differentiable all_reduce(a @ w.T) + bias."""
    return torch.ops.trident.matmul_all_reduce(
        a, w, bias, ctx.name, _schedule("matmul_all_reduce", schedule, algorithm),
        _encode_options("matmul_all_reduce", options))


# ---------------------------------------------------------------------------- torch.compile
# What Dynamo traces in place of the eager entries of trident.ccl and trident.ops (which
# Context's methods call). Each checks what the graph cannot carry and calls the op.
def _no_launch_options(name: str, block, programs, options=None) -> None:
    if block is not None or programs is not None or options:
        raise ValueError(f"{name}: launch options (block, programs, ...) are not supported "
                         f"inside torch.compile")


def _compiled_all_reduce(ctx, t, op="sum", algorithm=None, block=None, programs=None):
    _no_launch_options("all_reduce", block, programs)
    torch.ops.trident.all_reduce_(t, ctx.name, op, algorithm)
    return t


def _compiled_all_gather(ctx, out, inp, algorithm=None, block=None, programs=None):
    _no_launch_options("all_gather", block, programs)
    torch.ops.trident.all_gather_into(out, inp, ctx.name, algorithm)
    return out


def _compiled_reduce_scatter(ctx, out, inp, op="sum", algorithm=None, block=None,
                             programs=None):
    _no_launch_options("reduce_scatter", block, programs)
    torch.ops.trident.reduce_scatter_into(out, inp, ctx.name, op, algorithm)
    return out


def _compiled_all_to_all(ctx, out, inp, out_splits=None, in_splits=None, algorithm=None,
                         block=None, programs=None):
    _no_launch_options("all_to_all", block, programs)
    torch.ops.trident.all_to_all_into(
        out, inp, None if out_splits is None else list(out_splits),
        None if in_splits is None else list(in_splits), ctx.name, algorithm)
    return out


def _compiled_broadcast(ctx, t, src=0, algorithm=None, block=None, programs=None):
    _no_launch_options("broadcast", block, programs)
    torch.ops.trident.broadcast_(t, src, ctx.name, algorithm)
    return t


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


for _original, _standin in (
        (_ccl.all_reduce, _compiled_all_reduce), (_ccl.all_gather, _compiled_all_gather),
        (_ccl.reduce_scatter, _compiled_reduce_scatter),
        (_ccl.all_to_all, _compiled_all_to_all), (_ccl.broadcast, _compiled_broadcast),
        (_ccl.all_reduce_add_rmsnorm, _compiled_add_rmsnorm),
        (_ops.all_gather_matmul, _compiled_fused("all_gather_matmul")),
        (_ops.matmul_reduce_scatter, _compiled_fused("matmul_reduce_scatter")),
        (_ops.matmul_all_reduce, _compiled_fused("matmul_all_reduce"))):
    torch.compiler.substitute_in_graph(_original, skip_signature_check=True)(_standin)

__all__ = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
           "all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce",
           "all_reduce_add_rmsnorm", "context",
           "register", "unregister"]
