"""Host time of a call with its device work and its network left out: on one rank, every
Triton launch, launch-plan host step and torch.distributed collective becomes a no-op, so
that a call runs only its Python (checks, selection, views, the torch ops that stay) and
can be timed on that rank alone while the others wait (trident/bench/host.py does this for
one node's ops; bench/lab/hierarchical.py for the paths across nodes). CPU emulation:
the interpreter's launches are the ones made no-ops besides the plans' Launches.

After such a pass the timed rank has made calls the others have not: reset the context
(ctx.reset()) before it is used again.
"""
from __future__ import annotations

import contextlib
import statistics

import torch.distributed as dist

from trident.bench import counting, host

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
               "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
               "all_to_all", "all_to_all_single", "broadcast", "reduce", "gather", "scatter",
               "barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv",
               "all_gather_object", "broadcast_object_list")


@contextlib.contextmanager
def silent(node):
    """On this rank: Launch.__call__ and the plans' host steps (host._silence), every
    interpreted launch (direct kernel[grid] calls) and torch.distributed's collectives
    (also where trident.ccl.nccl keeps them under other names) are no-ops."""
    from triton.runtime import interpreter
    from trident.ccl import nccl
    undo = host._silence(node)
    real = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
    patched = [(dist, name, fn) for name, fn in real.items()]
    patched += [(nccl, name, fn) for name, fn in vars(nccl).items()
                if any(fn is r for r in real.values())]
    patched.append((interpreter.GridExecutor, "__call__", interpreter.GridExecutor.__call__))
    for obj, name, _ in patched:
        setattr(obj, name, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        for obj, name, fn in patched:
            setattr(obj, name, fn)
        undo()


def times(ctx, items: list, calls: int, batch: int) -> list[dict]:
    """Per item (an object with fn(), setup() and skip, e.g. hierarchical.Item): {silent_us:
    the fastest batch's us per call, silent_median_us} or {silent_note: why not}; {} for a
    skipped one. `calls` calls in batches of `batch`, timed on rank 0 alone while the others
    wait for its results, which every rank returns. For the CPU emulation (on GPUs a
    direct kernel[grid] launch is not silenced). A call that still reaches a collective
    raises before it runs (one guarded call first), instead of hanging."""
    out = []
    if ctx.rank == 0:
        for item in items:
            if item.skip:
                out.append({})
                continue
            try:
                with silent(ctx.node):
                    item.setup()
                    with counting.TorchOps(forbid="collective"):
                        item.fn()
                    ts = host._time(item.fn, calls, batch)
                out.append(dict(silent_us=min(ts) / 1e3,
                                silent_median_us=statistics.median(ts) / 1e3))
            except Exception as e:                                   # noqa: BLE001
                out.append(dict(silent_note=f"{type(e).__name__}: {str(e)[:120]}"))
    box = [out]
    dist.broadcast_object_list(box, src=0, group=ctx.group)
    return box[0]
