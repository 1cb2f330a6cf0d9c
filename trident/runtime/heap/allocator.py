"""A first-fit sub-allocator over one symmetric heap.

Every rank runs the same sequence of allocations, so the same request gets the same
offset everywhere -- that is what makes `translate` work. The allocator keeps a sorted
free list, merges neighbouring free blocks on free, and keeps a running hash of the
request sequence so that ranks that diverge can be caught at the next barrier.
"""
from __future__ import annotations

import bisect
import hashlib

ALIGNMENT = 256


class HeapFullError(MemoryError):
    """The symmetric heap has no free block large enough for a request."""


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


class Allocator:
    def __init__(self, size: int, alignment: int = ALIGNMENT):
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        self.size = size
        self.alignment = alignment
        self._free = [(0, size)]          # sorted (offset, length), never adjacent
        self._used: dict[int, int] = {}   # offset -> length
        self.bytes_in_use = 0
        self._hash = hashlib.blake2b(digest_size=8)
        self.log: list[str] = []          # requests since the last barrier, for error messages

    # -- bookkeeping for the cross-rank check
    def record(self, what: str) -> None:
        self._hash.update(what.encode())
        self.log.append(what)

    def digest(self) -> int:
        return int.from_bytes(self._hash.digest(), "little", signed=True)

    # -- allocation
    def alloc(self, nbytes: int, what: str = "") -> int:
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative number of bytes ({nbytes})")
        self.record(f"alloc {nbytes} B {what}".rstrip())
        length = _align(max(nbytes, 1), self.alignment)
        for i, (off, free_len) in enumerate(self._free):
            if free_len >= length:
                if free_len == length:
                    del self._free[i]
                else:
                    self._free[i] = (off + length, free_len - length)
                self._used[off] = length
                self.bytes_in_use += length
                return off
        raise HeapFullError(
            f"symmetric heap is full: heap size {self.size} B ({self.size / 2**20:.1f} MiB), "
            f"{self.bytes_in_use} B in use in {len(self._used)} allocations, largest free block "
            f"{max((l for _, l in self._free), default=0)} B; request was {nbytes} B {what}. "
            f"Free tensors with ctx.free(t) or raise the size: td.init(heap_size=...) "
            f"or the TRIDENT_HEAP_SIZE environment variable.")

    def free(self, offset: int) -> None:
        length = self._used.pop(offset, None)
        if length is None:
            raise ValueError(f"offset {offset} is not the start of a live allocation")
        self.record(f"free @{offset}")
        self.bytes_in_use -= length
        i = bisect.bisect_left(self._free, (offset, 0))
        self._free.insert(i, (offset, length))
        # merge with the right neighbour, then the left one
        if i + 1 < len(self._free) and offset + length == self._free[i + 1][0]:
            self._free[i] = (offset, length + self._free.pop(i + 1)[1])
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:
            prev_off, prev_len = self._free[i - 1]
            self._free[i - 1] = (prev_off, prev_len + self._free.pop(i)[1])

    def live_offsets(self) -> list[int]:
        return sorted(self._used)

    def mark(self) -> tuple:
        """The request history now, for `rewind`."""
        return self._hash.copy(), len(self.log)

    def rewind(self, mark: tuple) -> None:
        """Make the request history what it was at `mark`, as if the requests since (freed
        again by the caller) had never been made: for a rank that undoes a call its peers
        did not make."""
        self._hash = mark[0].copy()
        del self.log[mark[1]:]

    def restart_log(self) -> None:
        """Forget the request history (all ranks must do this at the same point)."""
        self._hash = hashlib.blake2b(digest_size=8)
        self.log.clear()

    def owns(self, offset: int) -> bool:
        return offset in self._used

    def is_free(self, offset: int) -> bool:
        """True if `offset` lies in a free block (e.g. a tensor that was freed already)."""
        i = bisect.bisect_right(self._free, (offset, self.size + 1)) - 1
        return i >= 0 and self._free[i][0] <= offset < self._free[i][0] + self._free[i][1]

    def length(self, offset: int) -> int:
        return self._used[offset]
