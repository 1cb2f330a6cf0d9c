"""trident as PyTorch custom ops (namespace "trident"): usable inside torch.compile,
CUDA graphs and autograd.

The ops find the rank's Context by its name (`ctx.name`, a string: the group's name, the
context's number and the world size), never by a Python object in the graph, as torch
symm-mem finds a group by `group_name`. Every Context is findable by name from its init
to its close (trident/runtime/context.py: named); an ExpertParallel likewise (ep.name,
trident/moe/expert_parallel.py).

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
-> out, the fused all-reduce + residual add + RMSNorm mutating its residual;
    trident::matmul_all_reduce_add_rmsnorm(a, w, residual, norm_weight, eps, bias, group,
                                           schedule, options) -> (out, res)   (no grad)
and its in-place twin trident::matmul_all_reduce_add_rmsnorm_(..., Tensor(a!) residual, ...)
-> out.

Gradients are those of the sum of every rank's loss (torch.distributed.nn's convention):
the gradient of all_reduce is the all_reduce of the gradients. A loss computed the same
on every rank (Megatron style) therefore gets world_size times its gradient; divide it by
the world size. A bias of the row-parallel ops must be the same on every rank (it is
added once), and gets the gradient of that one shared parameter.

The calls users make eagerly (ctx.all_reduce(t), ctx.all_gather(out, inp),
ctx.matmul_all_reduce(a, w), ...) work unchanged inside torch.compile(fullgraph=True):
this module registers a stand-in for each trident.ccl / trident.ops entry
(trident/runtime/compiled.py): the entry calls it while Dynamo traces, and it calls the
custom op. Eager calls never run the stand-ins (an entry pays ~60 ns for the question).
The fused ops' options (gemm=, config=, split_k=, num_pushers=) go through too, so that
a compiled graph can force a GEMM core or config family; the collectives' launch
options (block, programs, ...) raise a ValueError there.

The functions exported here (all_reduce(ctx, t), ...) are the differentiable functional
forms for model code, eager or compiled. Files: common.py (the namespace, finding a
context or ExpertParallel by name), collectives.py, fused.py (GEMM + communication,
all-reduce + RMSNorm), moe.py. Loaded when the first context opens (trident/torch/).
"""
from .collectives import all_gather, all_reduce, all_to_all, broadcast, reduce_scatter
from .common import context
from .fused import (all_gather_matmul, all_reduce_add_rmsnorm, matmul_all_reduce,
                    matmul_all_reduce_add_rmsnorm, matmul_reduce_scatter)
from .moe import moe_combine, moe_dispatch

__all__ = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
           "all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce",
           "all_reduce_add_rmsnorm", "matmul_all_reduce_add_rmsnorm", "moe_dispatch",
           "moe_combine", "context"]
