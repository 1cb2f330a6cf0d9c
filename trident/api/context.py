"""trident.Context and trident.init: the runtime's context (trident/runtime/context.py:
rank, world size, device, heap, sync, lifetime) with the families' methods on it
(context_ops.py: the collectives, fused ops and tracing, which hand over to trident.ccl,
trident.ops and trident.trace), and the function that makes one -- or, across nodes, a
trident.WorldContext (trident/nodes/world.py).

It sits above the families it ties together; the runtime and the families import none of
this package (they take the context as an argument).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..runtime import _env, launch as _launch, options, placement
from ..runtime.context import DEFAULT_TIMEOUT_S, Context as _RuntimeContext, check_init_args
from .context_ops import OpMethods


class Context(_RuntimeContext, OpMethods):
    """Created by `trident.init`; holds the heap and offers the collectives and ops.

    Attributes: rank, world_size, device, backend ("cuda" or "cpu"), heap_size,
    topology (trident.nodes.topology.Topology: one node, set by trident.init; None otherwise),
    ranks_per_device (ranks of the group on this rank's GPU; 1 on the CPU emulation),
    heap_bases (int64 tensor on `device`: where each rank's heap lives in this process),
    ctrl (this rank's control block: error word, timeout, barrier epoch and flags),
    trace_buffer (the event buffer of the active `ctx.trace(...)` session, else None: set
    by trident.trace, read by ops through trident.trace.kernel_args).
    """

    def __init__(self, heap_size: int | None = None, group=None, timeout: float | None = None,
                 debug: bool | None = None):
        if _env.INTERPRET:
            from .. import sanitize
            if sanitize.requested():    # TRIDENT_SANITIZE=1: on from init's last barrier
                sanitize.install_auto(type(self))
        super().__init__(heap_size, group, timeout, debug)


def init(heap_size: int | None = None, group=None, timeout: float | None = None,
         debug: bool | None = None) -> Context:
    """Collective over `group` (default: the whole job): map every rank's symmetric heap.

    Under torchrun (RANK/WORLD_SIZE set) the process group is created if it is not yet:
    NCCL with a GPU per rank; gloo when LOCAL_WORLD_SIZE exceeds the visible GPUs, which
    ranks then share round-robin (LOCAL_RANK % GPUs). Ranks that share a GPU need an MPS
    daemon (`nvidia-cuda-mps-control -d` before the job; TRIDENT_MPS=off lets them
    time-slice instead, at milliseconds per cross-rank wait) and each its share of the GPU
    as CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (100 // ranks per GPU): init sets it when it is
    unset and CUDA is not initialised yet in this process, and refuses to go on without it
    (or with a larger one) otherwise (trident/runtime/placement.py).
    heap_size defaults to $TRIDENT_HEAP_SIZE or 1 GiB; timeout (seconds) bounds every
    device wait; debug=True checks for timed-out waits after every op.

    Ranks on several nodes (host names, LOCAL_WORLD_SIZE, or TRIDENT_NODE_SIZE=n on one
    machine; trident/nodes/topology.py) get a trident.WorldContext: the same methods over
    the whole world, with a node-local Context inside (docs/nodes.md, "Beyond one node").
    """
    check_init_args(heap_size, timeout)
    local = options.get("LOCAL_WORLD_SIZE", 0)
    if not _env.INTERPRET and local and not (dist.is_initialized() and
                                             dist.get_backend() == "nccl"):
        # ranks that will share a GPU: their MPS cap, before CUDA initialises here (set_device
        # below does; device_count does not). An NCCL group cannot serve them: Context says so
        placement.ensure_share(placement.ranks_on_my_gpu(
            local, torch.cuda.device_count(), options.get("LOCAL_RANK", 0)))
    if not dist.is_initialized() and options.raw("RANK") is not None \
            and options.raw("WORLD_SIZE") is not None:
        backend = "gloo"
        if not _env.INTERPRET:
            gpus = torch.cuda.device_count()
            torch.cuda.set_device(placement.device_index(options.get("LOCAL_RANK", 0), gpus))
            # ranks that outnumber the GPUs share them: NCCL cannot, gloo can
            if options.get("LOCAL_WORLD_SIZE", 1) <= gpus:
                backend = "nccl"
        dist.init_process_group(backend)
    from ..nodes import topology
    # the node and rail groups give up after the host timeout (a node that skips a call)
    layout = topology.discover(group, (DEFAULT_TIMEOUT_S if timeout is None else timeout) + 5.0)
    if layout.spans_nodes:          # a node-local context inside a world of nodes
        from ..nodes.world import WorldContext
        node = Context(heap_size=heap_size, group=layout.node_group, timeout=timeout,
                       debug=debug)
        node.topology = topology.Topology(layout.node_size, layout.local_rank,
                                          layout.node_size, layout.source)
        return WorldContext(node, layout)
    ctx = Context(heap_size=heap_size, group=group, timeout=timeout, debug=debug)
    ctx.topology = layout
    return ctx


def _rank_init(heap_size, timeout):
    """What a rank started by trident.launch runs once its process group is up."""
    return init(heap_size=heap_size, timeout=timeout)


_launch.register_rank_init(None, _rank_init)
