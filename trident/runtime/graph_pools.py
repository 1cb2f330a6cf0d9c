"""Buffers kept past a call, made where no CUDA-graph pool takes them.

torch.compile(mode="reduce-overhead") (cudagraph trees) warms a graph up and records it
with every allocation of the calling thread routed into the graphs' private pool (torch >=
2.8: torch._C._cuda_beginAllocateCurrentThreadToPool, on any stream; before 2.8: those on
the tree's stream). A buffer kept from there -- a plan's workspace, a launch's global
scratch -- is a live block of the pool that no graph output accounts for:
cudagraph_trees.check_memory_pool raises "Detected N tensor(s) in the cudagraph pool not
tracked as outputs", and the tree may hand the block out again to another tensor.
"""
from __future__ import annotations

import torch

_alloc_thread = None            # runs outside_graph_pools' allocations
_alloc_streams: dict = {}       # device index -> the stream they are made on


def outside_graph_pools(device: torch.device, what: str, make):
    """make() -> tensor or tuple of tensors, allocated where no CUDA-graph pool takes them:
    for buffers a launch plan keeps past the call (a plan's workspace), made at the call
    that first needs them -- which may be torch.compile's warm-up run.

    mode="reduce-overhead" (cudagraph trees) warms a graph up and records it with every
    allocation of the calling thread routed into the graphs' private pool (torch >= 2.8:
    torch._C._cuda_beginAllocateCurrentThreadToPool, on any stream; before 2.8: those on
    the tree's stream). A buffer kept from there is a live block of the pool that no graph
    output accounts for: cudagraph_trees.check_memory_pool raises "Detected N tensor(s) in
    the cudagraph pool not tracked as outputs", and the tree may hand the block out again.
    So the buffers are made by a thread of trident's own, on a stream of its own (neither
    routing matches it); the current stream waits for that stream (the counters' memset)
    and is recorded as a user of every buffer (record_stream: once freed, their memory is
    reused only after its work). Inside a real stream capture nothing may be allocated or
    waited for: the call must have been made once eagerly first (a warm-up), which made
    them. On the CPU emulation the thread makes them too (the tests check that a call
    leaves nothing it allocated alive on the calling thread)."""
    cuda = device.type == "cuda"
    if cuda and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{what} would be allocated inside a CUDA-graph capture (this size was not "
            f"called before). Call the op once eagerly with these sizes before capturing "
            f"(a warm-up; torch.compile's mode='reduce-overhead' does one itself).")
    global _alloc_thread
    if _alloc_thread is None:
        from concurrent.futures import ThreadPoolExecutor
        _alloc_thread = ThreadPoolExecutor(1, thread_name_prefix="trident-alloc")
    if not cuda:
        return _alloc_thread.submit(make).result()
    user = torch.cuda.current_stream(device)

    def on_own_thread():
        with torch.cuda.device(device):
            side = _alloc_streams.get(device.index)
            if side is None:
                side = _alloc_streams[device.index] = torch.cuda.Stream(device)
            with torch.cuda.stream(side):
                return make(), side

    made, side = _alloc_thread.submit(on_own_thread).result()
    user.wait_stream(side)
    for t in made if isinstance(made, tuple) else (made,):
        t.record_stream(user)
    return made
