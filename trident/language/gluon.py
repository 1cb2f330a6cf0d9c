"""The device API from Gluon kernels (`triton.experimental.gluon`, Triton 3.6).

There is one device API, and Gluon kernels call it as it is:

    from triton.experimental.gluon import language as gl
    import trident.language as tdl
    from trident.language.gluon import jit

    @jit
    def kernel(buf, flag, ctrl, heap_bases, rank, peer, n, BLOCK: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])
        offs = gl.arange(0, BLOCK, layout)
        x = gl.load(buf + offs, mask=offs < n)
        tdl.store(buf + offs, x, rank, peer, heap_bases, mask=offs < n)   # same helper
        tdl.signal(flag, 1, rank, peer, heap_bases)
        tdl.wait(flag, 1, ctrl, rank, peer)

Why that works: Triton's code generator compiles a @triton.jit function called from a
@gluon.jit kernel with the caller's (Gluon) semantics, so `tl.load`, `tl.atomic_*`,
`tl.inline_asm_elementwise` and `tl.debug_barrier` inside trident.language's helpers
become the Gluon operations of the same names (Gluon re-exports them unchanged). The
helpers' values take the layouts of the tensors passed in. What Gluon changes is that a
tensor made from nothing needs a layout: `tl.arange`, `tl.full`, `tl.zeros` do not
compile in a Gluon caller. trident.language's helpers therefore make no such tensors
(scalars are spelled `tl.cast(v, tl.int64)`, not `tl.full([], v, tl.int64)`);
tests/compile/gluon_api.py compiles every helper from a Gluon kernel for sm_90a, so a
helper that breaks the rule fails CI.

The heap bases: `tdl.translate` reads two bases per call. A kernel keeps them in
registers by translating each peer's pointer once, before its tile loop (as
trident/ccl/all_gather/gluon.py does), not per access.

`jit`: `gluon.jit` on GPUs. Under the Triton interpreter (the CPU emulation) a Gluon
kernel does not run -- Triton's interpreter knows only `triton.language` -- so there the
kernel is handed to the interpreter with Gluon's operations mapped onto it
(trident/runtime/emulation.py: layouts are no-ops; shared memory, TMA and mbarriers are not
mapped and raise NotImplementedError if a kernel uses them).
"""
from __future__ import annotations

from ..runtime._env import INTERPRET


def jit(fn):
    """Decorate a Gluon kernel: compiled by Gluon on GPUs, interpreted on the CPU emulation.

    Only kernels (launched with `kernel[grid](...)`) take this decorator; helpers they call
    are @triton.jit functions (trident.language's, or a kernel module's own)."""
    if INTERPRET:
        from ..runtime.emulation import gluon_kernel
        return gluon_kernel(fn)
    from triton.experimental import gluon
    return gluon.jit(fn)
