"""The symmetric heap: one allocation per rank, mapped by every peer, and its sub-allocator."""
from .allocator import ALIGNMENT, Allocator, HeapFullError

__all__ = ["Allocator", "HeapFullError", "ALIGNMENT"]
