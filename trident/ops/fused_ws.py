"""What the fused ops' warp-specialised Gluon GEMM programs share (fused_gluon.py:
all_gather_matmul; matmul_reduce_gluon.py: matmul_reduce_scatter and matmul_all_reduce):
their shared-memory rings and the hand-over of each work unit from the producer warp to
the consumer warp groups.

A program's rings: STAGES slots of A and W blocks for the TMA loads (gemm_ws.load_step /
mma_steps, with their `ready` / `empty` mbarriers), and STAGES int32 slots (`ids`, with
`id_ready` / `id_empty` mbarriers, used the same way) through which the producer hands
each unit it took from the workspace's queue to the consumers -- only one partition may
take units from the queue (one atomic each), and both must walk the same ones. A slot
holds 2 * unit + ok, ok the verdict of the waits the producer did for the unit (all
_gather_matmul's: its rows' flags; true where it waits for nothing), or -1: the queue is
empty.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier


@gluon.jit
def alloc_rings(a_desc, w_desc, STAGES: gl.constexpr):
    """(a_bufs, w_bufs, ready, empty, ids, id_ready, id_empty): the rings of one GEMM
    program, every mbarrier initialised (count 1) and fenced for the async proxy."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = w_desc.block_type.shape[0]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BN, BK], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ids = gl.allocate_shared_memory(gl.int32, [STAGES, 1],
                                    gl.SwizzledSharedLayout(1, 1, 1, [0]))
    id_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    id_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
        mbarrier.init(id_ready.index(s), count=1)
        mbarrier.init(id_empty.index(s), count=1)
    fence_async_shared()
    return a_bufs, w_bufs, ready, empty, ids, id_ready, id_empty


@gluon.jit
def release_rings(ready, empty, id_ready, id_empty, STAGES: gl.constexpr):
    """Invalidate the rings' mbarriers (after gl.warp_specialize returned)."""
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))
        mbarrier.invalidate(id_ready.index(s))
        mbarrier.invalidate(id_empty.index(s))


@gluon.jit
def hand_over(ids, id_ready, id_empty, j, unit, ok, STAGES: gl.constexpr):
    """The producer's j-th hand-over: 2 * unit + ok (ok: an int1; unit -1 with ok true
    stores -1, the end) into slot j % STAGES once the consumers freed it (a fresh
    mbarrier passes the first round's wait at once, as load_step's)."""
    one: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    q = j % STAGES
    mbarrier.wait(id_empty.index(q), ((j // STAGES) & 1) ^ 1)
    ids.index(q).store(gl.full([1], 2 * unit + ok.to(gl.int32), gl.int32, one))
    mbarrier.arrive(id_ready.index(q))


@gluon.jit
def hand_over_end(ids, id_ready, id_empty, j, STAGES: gl.constexpr):
    """The producer's last hand-over: -1, the queue is empty."""
    one: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    q = j % STAGES
    mbarrier.wait(id_empty.index(q), ((j // STAGES) & 1) ^ 1)
    ids.index(q).store(gl.full([1], -1, gl.int32, one))
    mbarrier.arrive(id_ready.index(q))


@gluon.jit
def next_unit(ids, id_ready, id_empty, j, STAGES: gl.constexpr, NUM_WARPS: gl.constexpr):
    """The consumers' j-th hand-over (what hand_over stored); its slot freed."""
    every: gl.constexpr = gl.BlockedLayout([1], [32], [NUM_WARPS], [0])
    q = j % STAGES
    mbarrier.wait(id_ready.index(q), (j // STAGES) & 1)
    v = gl.max(ids.index(q).load(every), axis=0)
    mbarrier.arrive(id_empty.index(q))     # one thread's, after a barrier of the partition
    return v
