"""A Gluon kernel that calls every helper of trident.language (the device API), so that
tests/compile/sm90.py compiles each of them from Gluon for sm_90a: a helper that makes a
tensor Gluon cannot build without a layout (tl.arange, tl.full, tl.zeros) fails there.
The kernel computes nothing useful; it is compiled, never launched."""
from triton.experimental.gluon import language as gl

import trident.language as tdl
from trident.language.gluon import jit


@jit
def _device_api_kernel(out, inp, flag, ctrl, heap_bases, rank, world, n, BLOCK: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout)
    mask = offs < n
    x = gl.load(inp + offs, mask=mask)
    epoch = tdl.launch_epoch(flag + 3)
    for i in range(1, world):
        peer = (rank + i) % world
        tdl.store(out + offs, x, rank, peer, heap_bases, mask=mask)
        tdl.put(out + offs, inp + offs, rank, peer, heap_bases, mask=mask)
        tdl.get(out + offs, inp + offs, rank, peer, heap_bases, mask=mask)
        gl.store(out + offs, tdl.load(inp + offs, rank, peer, heap_bases, mask=mask), mask=mask)
        gl.store(tdl.translate(out, rank, peer, heap_bases) + offs, x, mask=mask)
    tdl.signal(flag, epoch, rank, 1, heap_bases)
    tdl.signal(flag + 1, 1, rank, 1, heap_bases, add=True)
    ok = tdl.wait(flag, epoch, ctrl, rank, 1)
    a = tdl.atomic_add(flag, 1, rank, 1, heap_bases, sem="release")
    a += tdl.atomic_cas(flag, epoch, epoch + 1, rank, 1, heap_bases, sem="acquire", scope="gpu")
    a += tdl.atomic_xchg(flag, 1, rank, 1, heap_bases)
    a += tdl.atomic_max(flag, 1, rank, 1, heap_bases)
    a += tdl.atomic_min(flag, 1, rank, 1, heap_bases)
    a += tdl.atomic_and(flag, 1, rank, 1, heap_bases)
    a += tdl.atomic_or(flag, 1, rank, 1, heap_bases)
    a += tdl.atomic_xor(flag, 1, rank, 1, heap_bases, sem="relaxed")
    a += tdl.load_acquire(flag) + tdl.timestamp()
    tdl.backoff()
    tdl.fence_async_proxy()
    tdl.barrier(ctrl, rank, world, heap_bases)
    if tdl.last_program_out(flag + 4, gl.num_programs(0)):
        gl.store(flag + 5, a + ok.to(gl.int64))
