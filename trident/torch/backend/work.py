"""The Work a trident collective returns (torch.distributed's handle of a collective).

trident queues its kernels on the current stream, so a call that returns has nothing left
to do on the host. A Work of an async call (`async_op=True`) on a GPU holds an event
recorded after the call's kernels: `wait()` makes the stream that is current then wait for
it, as NCCL's Work does, so that a caller that switched streams in between is still
ordered after the collective. On the CPU emulation the kernels have run when the call
returns, and the Work is complete at once. Calls that are not async (opts.asyncOp False:
torch.distributed's functions wait at once and drop the Work) share one complete Work.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


_work_init = dist.Work.__init__


class TridentWork(dist.Work):
    """A trident collective's Work: complete on the host; `wait()` orders the current
    stream after it (see the module docstring). `result` is what `get_future()` holds (the
    output tensors, as NCCL's future does)."""

    def __init__(self, result=None, event=None, device=None):
        _work_init(self)             # (super().__init__() costs a lookup more per call)
        self._result = result
        self._event = event
        self._device = device

    def wait(self, timeout=None) -> bool:
        if self._event is not None:
            torch.cuda.current_stream(self._device).wait_event(self._event)
        return True

    def is_completed(self) -> bool:
        return self._event is None or self._event.query()

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def synchronize(self) -> None:
        self.wait()

    def result(self):
        return self._result

    def get_future(self) -> torch.futures.Future:
        """A future that holds the output tensors; on a GPU it is ordered after the
        collective for whichever stream waits on it (a CUDA-aware future)."""
        if self._event is None:
            fut = torch.futures.Future()
        else:
            self.wait()           # the current stream, then the future's events, follow it
            fut = torch.futures.Future(devices=[self._device])
        fut.set_result(self._result)
        return fut


DONE = TridentWork()


def issued(result, on_gpu: bool) -> TridentWork:
    """The Work of an async call just queued: with an event on the current stream on GPUs."""
    if not on_gpu:
        return TridentWork(result)
    event = torch.cuda.Event()
    event.record()
    return TridentWork(result, event, torch.cuda.current_device())
