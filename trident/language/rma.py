"""Remote memory access on the symmetric heap, used inside @triton.jit kernels.

Every helper takes `rank` (this process's rank), `peer` (the rank whose memory is meant)
and `heap_bases` (the int64 device tensor from `ctx.heap_bases`). A pointer into the
local heap is turned into the pointer to the same object on `peer` by `translate`.
"""
import triton
import triton.language as tl


@triton.jit
def translate(ptr, rank, peer, heap_bases):
    """The address of `ptr`'s object in `peer`'s heap, as seen from this process.

    Heap bases are at least 256-byte aligned, so the distance between two bases is a
    whole number of elements and of 16-byte vectors: the hint keeps vector accesses.
    """
    elem_bytes: tl.constexpr = max(ptr.dtype.element_ty.primitive_bitwidth // 8, 1)
    delta = (tl.load(heap_bases + peer) - tl.load(heap_bases + rank)) // elem_bytes
    delta = tl.multiple_of(delta, 256 // elem_bytes)
    return ptr + delta


@triton.jit
def load(ptr, rank, peer, heap_bases, mask=None, other=None):
    """Load from `peer`'s copy of `ptr`."""
    return tl.load(translate(ptr, rank, peer, heap_bases), mask=mask, other=other)


@triton.jit
def store(ptr, value, rank, peer, heap_bases, mask=None):
    """Store `value` into `peer`'s copy of `ptr`."""
    tl.store(translate(ptr, rank, peer, heap_bases), value, mask=mask)


@triton.jit
def get(dst_ptr, src_ptr, rank, peer, heap_bases, mask=None):
    """Copy `peer`'s `src_ptr` block into the local `dst_ptr` block (a pull)."""
    tl.store(dst_ptr, tl.load(translate(src_ptr, rank, peer, heap_bases), mask=mask), mask=mask)


@triton.jit
def put(dst_ptr, src_ptr, rank, peer, heap_bases, mask=None):
    """Copy the local `src_ptr` block into `peer`'s `dst_ptr` block (a push)."""
    tl.store(translate(dst_ptr, rank, peer, heap_bases), tl.load(src_ptr, mask=mask), mask=mask)


@triton.jit
def atomic_add(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = tl.constexpr("acq_rel"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Atomically add `val` to `peer`'s copy of `ptr`; returns the old value.
    `sem` and `scope` as in tl.atomic_add (defaults: acq_rel, system scope)."""
    return tl.atomic_add(translate(ptr, rank, peer, heap_bases), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_cas(ptr, cmp, val, rank, peer, heap_bases, sem: tl.constexpr = tl.constexpr("acq_rel"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Compare-and-swap on `peer`'s copy of `ptr`: store `val` where it equals `cmp`;
    returns the old value.
    `sem` and `scope` as in tl.atomic_cas (defaults: acq_rel, system scope)."""
    return tl.atomic_cas(translate(ptr, rank, peer, heap_bases), cmp, val, sem=sem, scope=scope)


@triton.jit
def atomic_xchg(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = tl.constexpr("acq_rel"),
                scope: tl.constexpr = tl.constexpr("sys")):
    """Atomically store `val` into `peer`'s copy of `ptr`; returns the old value.
    `sem` and `scope` as in tl.atomic_xchg (defaults: acq_rel, system scope)."""
    return tl.atomic_xchg(translate(ptr, rank, peer, heap_bases), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_max(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = tl.constexpr("acq_rel"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Atomic maximum of `peer`'s copy of `ptr` and `val`; returns the old value.
    `sem` and `scope` as in tl.atomic_max (defaults: acq_rel, system scope)."""
    return tl.atomic_max(translate(ptr, rank, peer, heap_bases), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_min(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = tl.constexpr("acq_rel"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Atomic minimum of `peer`'s copy of `ptr` and `val`; returns the old value.
    `sem` and `scope` as in tl.atomic_min (defaults: acq_rel, system scope)."""
    return tl.atomic_min(translate(ptr, rank, peer, heap_bases), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_and(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = tl.constexpr("acq_rel"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Atomic bitwise and of `val` into `peer`'s copy of `ptr`; returns the old value.
    `sem` and `scope` as in tl.atomic_and (defaults: acq_rel, system scope)."""
    return tl.atomic_and(translate(ptr, rank, peer, heap_bases), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_or(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = tl.constexpr("acq_rel"),
              scope: tl.constexpr = tl.constexpr("sys")):
    """Atomic bitwise or of `val` into `peer`'s copy of `ptr`; returns the old value.
    `sem` and `scope` as in tl.atomic_or (defaults: acq_rel, system scope)."""
    return tl.atomic_or(translate(ptr, rank, peer, heap_bases), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_xor(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = tl.constexpr("acq_rel"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Atomic bitwise xor of `val` into `peer`'s copy of `ptr`; returns the old value.
    `sem` and `scope` as in tl.atomic_xor (defaults: acq_rel, system scope)."""
    return tl.atomic_xor(translate(ptr, rank, peer, heap_bases), val, mask=mask, sem=sem, scope=scope)
