"""The sub-allocator on its own (no ranks needed)."""
import random

import pytest

from trident.runtime.heap.allocator import ALIGNMENT, Allocator, HeapFullError


def test_alignment_and_reuse():
    a = Allocator(1 << 20)
    x = a.alloc(100)
    y = a.alloc(1000)
    assert x % ALIGNMENT == 0 and y % ALIGNMENT == 0 and y >= x + 100
    a.free(x)
    assert a.alloc(50) == x            # first fit reuses the freed block
    a.free(y)


def test_random_alloc_free_never_overlaps_and_coalesces():
    rng = random.Random(7)
    a = Allocator(1 << 22)
    live = {}
    for _ in range(3000):
        if live and rng.random() < 0.45:
            off = rng.choice(list(live))
            a.free(off)
            del live[off]
        else:
            n = rng.randint(1, 20000)
            try:
                off = a.alloc(n)
            except HeapFullError:
                continue
            for o, m in live.items():
                assert off + n <= o or o + m <= off, "overlapping allocations"
            live[off] = n
    for off in list(live):
        a.free(off)
    assert a.bytes_in_use == 0
    assert a.alloc((1 << 22) - 1000) == 0   # everything merged back into one block


def test_full_heap_message():
    a = Allocator(4096)
    a.alloc(3000)
    with pytest.raises(HeapFullError) as e:
        a.alloc(2000, what="for shape [500] torch.float32")
    msg = str(e.value)
    for needle in ("4096 B", "3072 B in use", "request was 2000 B", "heap_size", "TRIDENT_HEAP_SIZE"):
        assert needle in msg, (needle, msg)


def test_bad_free_and_digest():
    a, b = Allocator(1 << 16), Allocator(1 << 16)
    with pytest.raises(ValueError):
        a.free(256)
    a.alloc(10), b.alloc(10)
    assert a.digest() == b.digest()
    b.alloc(20), a.alloc(21)
    assert a.digest() != b.digest()
