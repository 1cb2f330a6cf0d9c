"""The race detector's logs (see trident/sanitize/__init__.py): per rank one shared-memory
file with two banks, each one generation's kernel names, clock snapshots, accesses and
releases, as numpy views. The sizes below bound a generation (the span between two host
barriers); a full log is reported, never overrun."""
from __future__ import annotations

import numpy as np

MAX_PROGRAMS = 256            # programs of one launch the clocks have room for
_LAUNCHES = 4096              # per generation: kernel launches ...
_SEGMENTS = 16384             # ... clock snapshots ...
_ACCESSES = 1 << 19           # ... access records ...
_RELEASES = 1 << 16           # ... and release records
_NAME = 64
_HDR = 16                     # int64 header words: gen, n_acc, n_seg, n_rel, n_launch, full
_COORD = 40                   # access coordinate = owner rank << 40 | heap offset

READ, WRITE, ATOMIC = 0, 1, 2
_NEVER = np.iinfo(np.int64).max


class _Bank:
    """One generation's log of one rank, as numpy views of its shared-memory file."""

    def __init__(self, addr: int, comps: int):
        import ctypes

        def view(offset, dtype, shape):
            count = int(np.prod(shape))
            buf = (ctypes.c_uint8 * (count * np.dtype(dtype).itemsize)).from_address(addr + offset)
            return np.frombuffer(buf, dtype=dtype).reshape(shape)
        off = 0
        self.hdr = view(off, np.int64, (_HDR,)); off += _HDR * 8
        self.names = view(off, np.uint8, (_LAUNCHES, _NAME)); off += _LAUNCHES * _NAME
        self.segs = view(off, np.int32, (_SEGMENTS, comps)); off += _SEGMENTS * comps * 4
        self.acc = view(off, np.int64, (_ACCESSES, 8)); off += _ACCESSES * 64
        self.rel = view(off, np.int64, (_RELEASES, 8)); off += _RELEASES * 64
        self.size = off

    @staticmethod
    def nbytes(comps: int) -> int:
        return _HDR * 8 + _LAUNCHES * _NAME + _SEGMENTS * comps * 4 + _ACCESSES * 64 + _RELEASES * 64

