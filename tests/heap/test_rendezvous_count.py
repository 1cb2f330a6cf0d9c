"""The CUDA heap's rendezvous order (trident/runtime/heap/cuda.py): torch numbers a
rendezvous's store keys per process, so a rank that mapped a heap its peers did not (a
trident group over a subset) must not be ahead at the next heap over those peers. Here
torch's two symmetric-memory calls are stood in for by recorders, so the bookkeeping runs
on the CPU emulation: the ranks behind catch up over a group of themselves alone, the
heap's own rendezvous comes last and over the heap's group, and every rank ends at the
same count. On GPUs, tests/torch_dist/test_collectives.py runs the real thing (a subset's
group, then groups of every rank)."""
import pytest
import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

from trident.runtime.heap import cuda as heap_cuda


def _catch_up_then_map(ctx, ahead: int):
    calls = []
    saved = (symm_mem.rendezvous, symm_mem.empty, heap_cuda._mapped, heap_cuda._alone)
    symm_mem.rendezvous = lambda t, name: calls.append(name) or "handle"
    symm_mem.empty = lambda n, dtype, device: torch.empty(n, dtype=dtype)
    try:
        heap_cuda._mapped = ahead if ctx.rank == 0 else 0
        handle = heap_cuda._rendezvous(torch.empty(8, dtype=torch.uint8), ctx.group)
        alone = heap_cuda._alone
        return (handle, calls, heap_cuda._mapped, ctx.group.group_name,
                None if alone is None else (alone.group_name, dist.get_world_size(alone)))
    finally:
        symm_mem.rendezvous, symm_mem.empty, heap_cuda._mapped, heap_cuda._alone = saved


@pytest.mark.parametrize("ahead", [0, 2])
def test_ranks_behind_catch_up_before_the_heap_is_mapped(pool, ahead):
    if pool.world_size == 1:
        pytest.skip("a group of one maps no peer")
    for rank, (handle, calls, mapped, group, alone) in enumerate(
            pool.run(_catch_up_then_map, ahead)):
        assert handle == "handle" and mapped == ahead + 1, (rank, mapped)
        behind = 0 if rank == 0 else ahead
        assert calls[-1] == group and len(calls) == behind + 1, (rank, calls)
        if behind:
            assert alone is not None and alone[1] == 1, (rank, alone)
            assert calls[:-1] == [alone[0]] * behind, (rank, calls)
        else:
            assert alone is None, (rank, alone)
