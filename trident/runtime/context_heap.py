"""Context's symmetric-heap methods: the tensor factories (empty, zeros, ...), free,
is_symmetric / check_symmetric, heap offsets and peer views, and workspaces (heap objects
that live as long as the context, created collectively on an op's first call).

Part of the runtime's Context (context.py), which inherits HeapMethods; this module does not
import context.py."""
from __future__ import annotations

import math

import torch

from .errors import HeapMismatchError
from .heap.allocator import HeapFullError


class HeapMethods:
    """The heap methods of trident.Context. They use the context's device, world_size,
    heap_size, allocator, plans, _heap (the backend's mapping), _heap_ptr, _persistent,
    _workspaces, _calling, _closed, _check_open() and _barrier() (set by Context.__init__
    and trident.runtime.context_sync.SyncMethods)."""

    def _alloc(self, shape, dtype: torch.dtype) -> torch.Tensor:
        self._check_open()
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
            shape = tuple(shape[0])
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"negative dimension in shape {shape}")
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        offset = self.allocator.alloc(nbytes, what=f"for shape {list(shape)} {dtype}")
        return self._heap.local[offset:offset + nbytes].view(dtype).view(shape)

    def empty(self, *shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """An uninitialised tensor on the symmetric heap (same offset on every rank)."""
        return self._alloc(shape, dtype)

    def zeros(self, *shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._alloc(shape, dtype).zero_()

    def ones(self, *shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._alloc(shape, dtype).fill_(1)

    def full(self, shape, fill_value, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._alloc((shape,) if isinstance(shape, int) else shape, dtype).fill_(fill_value)

    def randn(self, *shape, dtype: torch.dtype = torch.float32, generator=None) -> torch.Tensor:
        return self._alloc(shape, dtype).normal_(generator=generator)

    def rand(self, *shape, dtype: torch.dtype = torch.float32, generator=None) -> torch.Tensor:
        return self._alloc(shape, dtype).uniform_(generator=generator)

    def arange(self, start, end=None, step=1, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        values = torch.arange(start, end, step, dtype=dtype) if end is not None \
            else torch.arange(start, dtype=dtype)
        return self._alloc(values.shape, dtype).copy_(values)

    def empty_like(self, t: torch.Tensor) -> torch.Tensor:
        return self._alloc(t.shape, t.dtype)

    def zeros_like(self, t: torch.Tensor) -> torch.Tensor:
        return self._alloc(t.shape, t.dtype).zero_()

    def is_symmetric(self, t: torch.Tensor) -> bool:
        """True if `t` lies in this context's heap (so peers can address it)."""
        if self._closed or not isinstance(t, torch.Tensor) or t.device != self.device:
            return False
        return (t.untyped_storage().data_ptr() == self._heap_ptr
                and self._heap_ptr <= t.data_ptr() < self._heap_ptr + self.heap_size)

    def in_heap(self, ptr: int) -> bool:
        """Whether address `ptr` lies in this rank's heap: a tensor at an address outside
        it is not symmetric (is_symmetric), wherever its storage comes from."""
        return self._heap_ptr <= ptr < self._heap_ptr + self.heap_size

    def check_not_freed(self, t: torch.Tensor, name: str) -> None:
        """Raise ValueError if `t` lies in heap memory that ctx.free gave back (a plan's
        build checks its tensors: ctx.free drops every plan, so a call after it builds
        again). A block the heap handed out again since is another tensor's, and passes."""
        p = t.data_ptr()
        if self.in_heap(p) and self.allocator.is_free(p - self._heap_ptr):
            raise ValueError(f"{name} lies in heap memory given back by ctx.free (heap offset "
                             f"{p - self._heap_ptr}): a tensor must not be used after "
                             f"ctx.free(t); make a new one (ctx.empty, ctx.zeros, ...)")

    def heap_offset(self, t: torch.Tensor) -> int:
        """Byte offset of heap tensor `t` from this rank's heap base: where its copy lies in
        every peer's heap too (translate: peer base + offset)."""
        return t.data_ptr() - self._heap_ptr

    def value_synchronised(self, t: torch.Tensor) -> None:
        """Declare heap tensor `t` synchronised by its values rather than by signals (the
        Lamport buffers, ccl/lamport.py: each word is its own ready flag). The race detector
        (trident.sanitize) does not check accesses to it: no signal orders them, and its
        vector clocks cannot see a value standing for one."""
        self.__dict__.setdefault("_value_synchronised", []).append(
            (self.heap_offset(t), t.numel() * t.element_size()))

    def peer_view(self, peer: int, t: torch.Tensor) -> torch.Tensor:
        """A torch tensor over `peer`'s copy of heap tensor `t` (same offset, shape and
        dtype; `t` contiguous). On GPUs, torch copies into it go over NVLink on the copy
        engines (the baseline for the kernels' own transfers)."""
        self.check_symmetric(t, "peer_view: t")
        if not t.is_contiguous():
            raise ValueError("peer_view: t must be contiguous")
        if not 0 <= peer < self.world_size:
            raise ValueError(f"peer_view: peer must be in [0, {self.world_size}), got {peer}")
        return self._heap.peer_view(peer, t.view(-1), 0, t.numel()).view(t.shape)

    def free(self, t: torch.Tensor) -> None:
        """Return `t`'s block to the heap. Every rank must free the same tensors in the same order."""
        if not self.is_symmetric(t):
            raise ValueError("ctx.free: tensor is not on this context's symmetric heap")
        offset = self.heap_offset(t)
        if self.allocator.is_free(offset):
            raise ValueError(f"ctx.free: the tensor at heap offset {offset} was freed already "
                             f"(double free)")
        if not self.allocator.owns(offset):
            raise ValueError(f"ctx.free: tensor at heap offset {offset} is a view inside an "
                             f"allocation, not the tensor the factory returned")
        self.plans.clear()           # plans may point into the block
        self.allocator.free(offset)

    def check_symmetric(self, t: torch.Tensor, name: str) -> None:
        """Raise a clear error unless `t` is on the heap (for use by ops)."""
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not self.is_symmetric(t):
            raise ValueError(f"{name} must be a tensor on the symmetric heap (made by ctx.empty/"
                             f"zeros/...): peers cannot address memory outside it")

    def free_since(self, live_before) -> None:
        """Free every allocation made since `live_before` (a set of live offsets), then
        restart the allocation history: all ranks end up with the same heap again, even
        after a function that failed part-way on some ranks (used by RankPool)."""
        keep = set(live_before) | self._persistent
        for offset in self.allocator.live_offsets():
            if offset not in keep:
                self.allocator.free(offset)
        self.allocator.restart_log()

    def workspace(self, key, factory):
        """A heap object that lives as long as the context (created on first use by
        `factory(ctx)`, on every rank at the same call). Ops keep their buffers here.

        Creation ends with a host barrier: a peer must not signal into flags this rank has
        not zeroed yet. So the first call of an op is not graph-capturable; warm up first.
        If creation fails on any rank (heap full, or ranks that asked for different sizes
        or skipped the call), every rank gives back what it allocated, so the heap is the
        same everywhere again and the context stays usable; the error names the op.
        """
        obj = self._workspaces.get(key)
        if obj is None:
            before = set(self.allocator.live_offsets())
            history = self.allocator.mark()
            error = None
            try:
                obj = factory(self)
            except HeapFullError as e:
                error = e
            made = set(self.allocator.live_offsets()) - before

            def roll_back(alone: bool = False):
                for offset in made:
                    self.allocator.free(offset)
                if alone:       # the peers may not have made this call at all
                    self.allocator.rewind(history)
                else:
                    self.allocator.restart_log()

            try:
                failed, keys = self._barrier("workspace", detail=key, failed=error is not None)
            except HeapMismatchError as e:
                roll_back()
                raise HeapMismatchError(
                    f"while {self._op_phrase()} created the workspace {key!r}: {e} Did "
                    f"every rank make this call, with the same sizes?") from None
            except BaseException:
                roll_back(alone=True)     # a peer that failed or made another call
                raise
            if keys is not None or any(failed):
                roll_back()
            if keys is not None:
                names = "; ".join(f"rank {r}: {k!r}" for r, k in enumerate(keys))
                kinds = {k[0] if isinstance(k, tuple) and k else k for k in keys}
                why = ("their sizes differ. Every rank must call with the same sizes."
                       if len(kinds) == 1 else
                       "the ranks made different calls here (another algorithm, schedule or "
                       "op, or sizes that lead to another one). Every rank must make the "
                       "same calls with the same arguments.")
                raise HeapMismatchError(
                    f"{self._op_phrase()}: the ranks created different workspaces ({names}): "
                    f"{why}")
            if any(failed):
                if error is None:
                    bad = [r for r, f in enumerate(failed) if f]
                    raise HeapFullError(
                        f"{self._op_phrase()} needs the workspace {key!r}, which does not fit "
                        f"in the symmetric heap of rank(s) {bad} (see the error there); make "
                        f"the heap larger: td.init(heap_size=...) or TRIDENT_HEAP_SIZE.")
                raise HeapFullError(f"{self._op_phrase()} needs the workspace {key!r}, "
                                    f"which does not fit: {error}") from None
            self._workspaces[key] = obj
            self._persistent |= made
        return obj

    def _op_phrase(self) -> str:
        return self._calling or "an op"

