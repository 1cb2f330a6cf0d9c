"""DeepEP's small types: EventOverlap (and the EventHandle inside it), Config, the
refusal helper.

trident runs every DeepEP call on the caller's current stream (DeepEP runs its normal and
non-hook low-latency kernels on a communication stream of its own). So work queued after
a call on the same stream is already ordered after it; an EventOverlap's wait matters only
to another stream, which it makes wait for the call's stream.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch


def refuse(argument: str, why: str) -> None:
    """Raise NotImplementedError for DeepEP's `argument` (never run silently different)."""
    raise NotImplementedError(f"trident.compat.deep_ep: {argument} is not supported: {why}")


class EventHandle:
    """A point on the stream current at creation (DeepEP's deep_ep.EventHandle): a
    torch.cuda.Event recorded there; on the CPU emulation, where every call has finished
    when it returns, nothing."""
    __slots__ = ("event",)

    def __init__(self, cuda: bool | None = None) -> None:
        if cuda is None:
            cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if cuda:
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.event = None

    def current_stream_wait(self) -> None:
        """The current stream waits for the recorded point."""
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)


class EventOverlap:
    """DeepEP's EventOverlap: `current_stream_wait()`, and `with event: ...` (the current
    stream waits at the end of the block). `event` is None where the call was not
    async_finish: its work is then already ordered on the current stream, and waiting
    is a no-op (DeepEP asserts there instead)."""
    __slots__ = ("event", "extra_tensors", "_release_handle_by_call", "hook_after_wait")

    def __init__(self, event: Optional[EventHandle] = None,
                 extra_tensors: Optional[tuple] = None) -> None:
        self.event = event
        self.extra_tensors = extra_tensors
        self._release_handle_by_call = False
        self.hook_after_wait: Optional[Callable] = None

    def current_stream_wait(self, release_handle: bool = False) -> None:
        """The current stream waits for the event (if any), then runs the registered hook."""
        if self.event is not None:
            self.event.current_stream_wait()
        if self.hook_after_wait is not None:
            hook, self.hook_after_wait = self.hook_after_wait, None
            hook()
        if release_handle:
            self.event = None

    def register_hook_after_wait(self, hook_after_wait: Callable) -> None:
        """Run `hook_after_wait` after the next current_stream_wait()."""
        if self.hook_after_wait is not None:
            raise ValueError("EventOverlap: a hook is already registered")
        self.hook_after_wait = hook_after_wait

    def __call__(self, release_handle: bool = False) -> "EventOverlap":
        self._release_handle_by_call = release_handle
        return self

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        if self.event is not None:
            self.current_stream_wait(release_handle=self._release_handle_by_call)
        self._release_handle_by_call = False


class _NoEvent(EventOverlap):
    """The event of a call that was not async_finish: one shared object (a warm call
    makes none), nothing to wait for; a hook cannot be registered on it (DeepEP asserts
    at the wait of such an event)."""
    __slots__ = ()

    def register_hook_after_wait(self, hook_after_wait: Callable) -> None:
        raise ValueError("EventOverlap: this call was not async_finish, it has no event to "
                         "wait for (DeepEP asserts there too)")


NO_EVENT = _NoEvent()


def event_for(async_finish: bool, cuda: bool) -> EventOverlap:
    """What a call returns as its event: recorded on the current stream with async_finish
    (as DeepEP), else NO_EVENT."""
    return EventOverlap(EventHandle(cuda)) if async_finish else NO_EVENT


def wait_previous(previous_event) -> None:
    """DeepEP's previous_event: the call's work waits for it (on the current stream)."""
    if previous_event is not None:
        if not isinstance(previous_event, EventOverlap):
            raise TypeError(f"previous_event must be an EventOverlap (Buffer.capture()), "
                            f"got {type(previous_event).__name__}")
        if previous_event.event is not None:
            previous_event.event.current_stream_wait()


class Config:
    """DeepEP's performance config of the normal mode (SMs, NVLink/RDMA chunk sizes).
    trident's normal mode has no chunked channels, so a Config changes no result and no
    kernel; it is accepted, checked like DeepEP's, and its size hints are DeepEP's."""

    def __init__(self, num_sms: int, num_max_nvl_chunked_send_tokens: int,
                 num_max_nvl_chunked_recv_tokens: int,
                 num_max_rdma_chunked_send_tokens: int = 6,
                 num_max_rdma_chunked_recv_tokens: int = 128) -> None:
        if num_sms < 0:
            raise ValueError(f"Config: num_sms must be >= 0, got {num_sms}")
        if not 0 < num_max_nvl_chunked_send_tokens < num_max_nvl_chunked_recv_tokens:
            raise ValueError("Config: need 0 < num_max_nvl_chunked_send_tokens < "
                             "num_max_nvl_chunked_recv_tokens")
        if num_max_rdma_chunked_send_tokens <= 0 or num_max_rdma_chunked_recv_tokens <= 0:
            raise ValueError("Config: the RDMA chunk sizes must be positive")
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = num_max_rdma_chunked_send_tokens
        s = num_max_rdma_chunked_send_tokens
        self.num_max_rdma_chunked_recv_tokens = -(-num_max_rdma_chunked_recv_tokens // s) * s

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """DeepEP's NVLink buffer size for this config (trident sizes its normal-mode
        buffers itself, as calls need them; a Buffer that makes its context adds this to
        the heap)."""
        channels, ranks = self.num_sms // 2, min(num_ranks, 8)
        rdma_ranks = max(num_ranks // 8, 1)
        recv = self.num_max_nvl_chunked_recv_tokens
        per_token = hidden_bytes + 8 + 128 * 8 + 128 * 4 + 128 * 4    # meta, top-k, scales
        n = channels * ranks * (2 * rdma_ranks + 3) * 4 + channels * ranks * recv * per_token
        return (n + 127) // 128 * 128

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """0 within one node (DeepEP's value there); across nodes: not supported."""
        if num_ranks > 8:
            refuse("get_rdma_buffer_size_hint(num_ranks > 8)",
                   "internode (RDMA) normal mode; trident.compat.deep_ep is intranode")
        return 0

    def __repr__(self) -> str:
        return (f"Config(num_sms={self.num_sms}, nvl_send={self.num_max_nvl_chunked_send_tokens}"
                f", nvl_recv={self.num_max_nvl_chunked_recv_tokens})")
