"""Device barrier: one program per rank signals every peer and waits for all of them.

Stream-ordered (no host synchronisation) and CUDA-graph capturable: the epoch lives in
the rank's control block on the device, so a replay raises it again.
"""
import triton

from .. import language as tdl


@triton.jit
def _barrier_kernel(ctrl, heap_bases, rank, world_size):
    tdl.barrier(ctrl, rank, world_size, heap_bases)


def device_barrier(ctx) -> None:
    _barrier_kernel[(1,)](ctx.ctrl, ctx.heap_bases, ctx.rank, ctx.world_size)
