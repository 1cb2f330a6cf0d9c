"""WorldContext: what `trident.init` returns when the ranks span several nodes.

The symmetric heap is mapped within a node only, and trident's kernels index their peers
by rank within the heap's group. So a world of M nodes of L ranks holds a node-local
trident Context (`ctx.node`: rank = local rank, world_size = L, group = the node's
ranks), and this object offers the same public methods over the whole world: rank and
world_size are the world's, the collectives are hierarchical (trident inside the node,
torch.distributed on the rails between nodes: trident/nodes/hierarchical), and the tensor
factories, free, sync and timeouts are the node's (a tensor is symmetric within its
node). What works on one node only -- kernels that address peers through the heap --
is not offered here: the fused GEMM ops fall back to torch.matmul + torch.distributed
over the world (the "plain" path), ExpertParallel takes the two-stage route across nodes
(expert_parallel.py, named by expert_parallel_class), device_barrier is the node's then
the rail's, and the rest (tracing, the fused all_reduce + RMSNorm, workspaces) raises
AttributeError that points to `ctx.node`.
"""
from __future__ import annotations

import pickle

import torch
import torch.distributed as dist

from ..ccl import nccl
from . import hierarchical, rail, topology
from .expert_parallel import ExpertParallelAcrossNodes

# what a WorldContext takes from its node's Context unchanged
_FROM_NODE = frozenset((
    "device", "backend", "heap_size", "empty", "zeros", "ones", "full", "randn",
    "rand", "arange", "empty_like", "zeros_like", "free", "is_symmetric", "check_symmetric",
    "check_not_freed", "heap_offset", "allocator", "sync", "set_timeout", "timeout_s",
    "host_timeout_s", "free_since", "leave", "ranks_per_device", "shares_device",
    "usable_sms", "heap_mapping", "capturing", "options"))


def _portable(e: BaseException | None) -> BaseException | None:
    """e, or a RuntimeError with its text where e does not survive pickling."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


class WorldContext:
    """A context over M nodes of L ranks (see the module docstring). Attributes: rank and
    world_size (the world's), group (the whole job), topology (trident.nodes.topology.Topology),
    node (this rank's node-local Context), spans_nodes (True), and those of the node's
    Context listed in _FROM_NODE."""

    spans_nodes = True
    # what td.ExpertParallel(ctx, ...) makes here (moe/expert_parallel.py, _NamedByContext)
    expert_parallel_class = ExpertParallelAcrossNodes

    def __init__(self, node, topology):
        self.node, self.topology = node, topology
        self.rank, self.world_size = topology.rank, topology.world_size
        self.group = dist.group.WORLD

    def __getattr__(self, name):
        if name in _FROM_NODE:
            return getattr(self.__dict__["node"], name)
        if name.startswith("__") or "node" not in self.__dict__:
            raise AttributeError(name)
        raise AttributeError(
            f"a trident context across nodes does not offer {name!r}: it works on the ranks "
            f"of one node, whose heap its kernels address. Use ctx.node.{name} (this node's "
            f"{self.topology.node_size} ranks) -- see docs/nodes.md, 'Beyond one node'")

    @property
    def debug(self) -> bool:
        """The node's debug mode (every op checked at once); settable."""
        return self.node.debug

    @debug.setter
    def debug(self, value: bool) -> None:
        self.node.debug = value

    @property
    def nccl_available(self) -> bool:
        """Whether torch.distributed collectives over the world can take this context's
        tensors: on the CPU emulation, or where the job's group is not gloo (GPU ranks
        that share a GPU, on any node, make it gloo)."""
        return self.backend == "cpu" or dist.get_backend(self.group) != "gloo"

    # ------------------------------------------------------------------ collectives
    def all_gather(self, out, inp, **options):
        """out [world*n, ...] = concatenation of every rank's inp [n, ...]."""
        return hierarchical.all_gather(self, out, inp, **options)

    def reduce_scatter(self, out, inp, op: str = "sum", **options):
        """out [n, ...] = this rank's block of the sum over ranks of inp [world*n, ...]."""
        return hierarchical.reduce_scatter(self, out, inp, op, **options)

    def all_reduce(self, t, op: str = "sum", **options):
        """In place: t = reduction of t over every rank of the world; returns t."""
        return hierarchical.all_reduce(self, t, op, **options)

    def all_to_all(self, out, inp, out_splits=None, in_splits=None, **options):
        """Rank r sends rows in_splits[p] of inp to rank p and receives out_splits[p] rows
        from rank p into out, in rank order (None: even splits)."""
        return hierarchical.all_to_all(self, out, inp, out_splits, in_splits, **options)

    def broadcast(self, t, src: int = 0, **options):
        """t on every rank = t of rank `src`; returns t."""
        return hierarchical.broadcast(self, t, src, **options)

    # ------------------------------------------------------------------ fused ops: plain
    def all_gather_matmul(self, a, w, bias=None, out=None, algorithm: str = "auto"):
        """all_gather(a, dim 0) @ w.T + bias, by torch.distributed + torch.matmul."""
        return self._plain("all_gather_matmul", a, w, bias, out, algorithm)

    def matmul_reduce_scatter(self, a, w, bias=None, out=None, algorithm: str = "auto"):
        """reduce_scatter(a @ w.T, dim 0) + bias, by torch.matmul + torch.distributed."""
        return self._plain("matmul_reduce_scatter", a, w, bias, out, algorithm)

    def matmul_all_reduce(self, a, w, bias=None, out=None, algorithm: str = "auto"):
        """all_reduce(a @ w.T) + bias, by torch.matmul + torch.distributed."""
        return self._plain("matmul_all_reduce", a, w, bias, out, algorithm)

    def _plain(self, op: str, a, w, bias, out, algorithm: str):
        """The fused ops' plain path over the whole world: the fused kernels need every
        rank on one heap. Checks as on one node; tensor parallelism belongs inside a node
        (ctx.node.<op>), where the fused kernels run."""
        from ..ops import _common, plain
        if algorithm not in ("auto", "plain", "nccl"):
            raise ValueError(f"{op}: a context across nodes runs the plain path only "
                             f"(torch.matmul + torch.distributed); algorithm must be 'auto', "
                             f"'plain' or 'nccl', got {algorithm!r}. The fused kernels run "
                             f"inside a node: ctx.node.{op}(...)")
        w_rows = w.shape[0] if isinstance(w, torch.Tensor) and w.dim() == 2 else 0
        m = a.shape[0] if isinstance(a, torch.Tensor) and a.dim() == 2 else 0
        shape = {"all_gather_matmul": (m * self.world_size, w_rows),
                 "matmul_reduce_scatter": (m // self.world_size, w_rows),
                 "matmul_all_reduce": (m, w_rows)}[op]
        _common.check_inputs(self, op, a, w, bias, out, shape, empty_k=op != "all_gather_matmul")
        if op == "matmul_reduce_scatter" and a.shape[0] % self.world_size:
            raise ValueError(f"{op}: a has {a.shape[0]} rows, not a multiple of the world "
                             f"size {self.world_size}")
        nccl.check_available(self, f"{op} across nodes (the plain path)", ["ctx.node." + op])
        return getattr(plain, op)(self, a, w, bias, out)

    # ------------------------------------------------------------------ lifetime
    def _rail_barrier(self, failed: BaseException | None = None) -> None:
        """After a node-wide barrier on every node: one tiny all_reduce on each rail, so
        that every rank of every node has arrived. It also says whether a node's barrier
        raised (on a node, every rank raises the same error): then every rank raises the
        error of the lowest such node, so that all ranks stay in step, as on one node."""
        group = self.topology.rail_barrier_group
        flag = torch.full((1,), 1 + (failed is not None), dtype=torch.int32,
                          device=nccl.host_device(self))
        rail.all_reduce(self.node, group, flag, "sum", what="ctx.barrier()")
        if flag.item() == self.topology.num_nodes:    # NCCL returns at once: wait here
            return
        errors_ = [None] * self.topology.num_nodes
        dist.all_gather_object(errors_, _portable(failed), group=group)
        first = next(e for e in errors_ if e is not None)
        if failed is None:
            raise first

    def device_barrier(self) -> None:
        """Stream-ordered barrier over the world: the node's device barrier, then a
        one-word all_reduce on the rail (NCCL, on the current stream: capturable; where
        the rail is gloo through host copies, a host synchronisation)."""
        self.node.device_barrier()
        word = torch.zeros(1, dtype=torch.int32, device=self.device)
        rail.all_reduce(self.node, self.topology.rail_group, word, "sum",
                        what="ctx.device_barrier()")

    def barrier(self) -> None:
        """Host barrier over the world: the node's barrier (its checks of errors and heap
        allocations, see Context.barrier), then the rails. An error one node's barrier
        raises is raised on every rank of the world."""
        try:
            self.node.barrier()
        except Exception as e:       # the other nodes must hear of it, then raise it here
            self._rail_barrier(e)
            raise
        self._rail_barrier()

    def reset(self) -> None:
        """Collective: reset the node's context on every node (Context.reset)."""
        self.node.reset()
        self._rail_barrier()

    def close(self) -> None:
        """Release the node's heap (collective over the world)."""
        if self.node._closed:
            return
        self.barrier()
        self.node.close()
        t = self.topology
        groups = (t.node_group, t.rail_group, t.rail_barrier_group)
        topology.forget_groups(*groups)
        for group in groups:
            dist.destroy_process_group(group)

    def __enter__(self) -> "WorldContext":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        t = self.topology
        return (f"trident.WorldContext(rank={self.rank}, world_size={self.world_size}, "
                f"nodes={t.num_nodes}x{t.node_size}, node={t.node}, local_rank={t.local_rank}, "
                f"backend={self.backend!r}, device={self.device})")
