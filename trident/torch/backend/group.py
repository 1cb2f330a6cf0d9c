"""TridentProcessGroup: the torch.distributed process group of backend "trident".

torch.distributed calls its methods (dist.all_reduce -> group.allreduce, the functional
collectives of DTensor and FSDP2 through torch's C++ side). Each either hands the call to
the group's trident Context or to the group's inner group (NCCL on GPUs, gloo on the CPU;
trident/torch/backend/inner.py), which is also the Context's host group.

Goes to trident, on tensors of trident's device (CUDA on GPUs; CPU on the emulation):
  all_reduce        SUM, MAX, MIN on bfloat16, float16, float32, int8, uint8, int32,
                    int64 (integers in their own type, wrapping as NCCL's); AVG on the
                    floats (the sum, then one division on the stream)
  all_gather_into_tensor, all_gather (lists), reduce_scatter_tensor (the same reductions
  and dtypes), reduce_scatter (lists), all_to_all_single (with splits), broadcast:
                    moving ops take every dtype
  their coalesced forms (as one call each), barrier (trident's host barrier, which also
  raises every rank's trident errors on every rank, once the group has a context)
Falls back to the inner group: other reductions (PRODUCT, PREMUL_SUM, bitwise, AVG on
integers) and dtypes,
tensors of another device (CPU tensors on GPUs), send/recv, gather, scatter, reduce,
all_to_all (lists), and everything on a group that spans nodes (its ranks have no heap in
common). `fallbacks` counts what fell back, by op.

Semantics are NCCL's: trident queues its kernels on the current stream; a call with
async_op=True returns a Work whose wait() orders the current stream after it
(trident/torch/backend/work.py); calls capture into CUDA graphs as trident's own do.
Tensors on the context's heap (`trident.torch.backend.context(group).empty(...)`) are used
in place; others are staged through the heap by the collective's launch plan.

One order on the GPU. trident's collectives on a context must run one after another on
the GPU (each launch takes the next epoch of the context's flags: trident/ccl/device.py),
while torch programs issue collectives on several streams (FSDP2 all-gathers on one and
reduce-scatters on another, which the GPU may run at once). So when a call comes on
another stream than the group's previous trident call, the new stream first waits for
the old one (an event recorded there now): every rank's kernels then run in the order the
calls were made, the same on every rank. Within a CUDA-graph capture, streams of the
capture are ordered the same way; a stream outside it is not waited on (capturing that
wait is not allowed, and torch.cuda.graph orders the capture after the eager work).

The Context is made at the group's first collective that trident serves (collective over
the group's ranks: it maps the heap), with the heap size, timeout and debug mode of
`trident.torch.backend.Options` (pg_options), else trident's defaults (TRIDENT_HEAP_SIZE).
That first call must not be captured into a CUDA graph.
"""
from __future__ import annotations

import operator
from collections import Counter

import torch
import torch.distributed as dist

from ...runtime import _env
from ...runtime.plans import plain_key
from . import fallback, inner
from .work import DONE, TridentWork, issued

_Op = dist.ReduceOp.RedOpType
_SUM = _Op.SUM


class _Mean(str):
    """trident's "sum" standing for torch's AVG: the sum, then a division by the world size."""


_AVG = _Mean("sum")
# the value of torch's reduction -> trident's
_REDUCE = {_Op.SUM.value: "sum", _Op.AVG.value: _AVG, _Op.MAX.value: "max",
           _Op.MIN.value: "min"}
_REDUCIBLE = None      # the dtypes trident reduces: _serves reads ccl/common.py's once

TRIDENT_OPS = ("all_reduce", "all_gather_into_tensor", "all_gather", "reduce_scatter_tensor",
               "reduce_scatter", "all_to_all_single", "broadcast", "barrier")
FALLBACK_OPS = ("send", "recv", "gather", "scatter", "reduce", "all_to_all")


class Options:
    """pg_options of `init_process_group("trident", pg_options=...)` / `new_group`:
    heap_size (bytes; default $TRIDENT_HEAP_SIZE or 1 GiB), timeout (seconds every device
    wait may take; default 30), debug (trident's debug mode)."""

    def __init__(self, heap_size: int | None = None, timeout: float | None = None,
                 debug: bool | None = None):
        self.heap_size, self.timeout, self.debug = heap_size, timeout, debug


def create(opts, backend_options=None) -> "TridentProcessGroup":
    """The creator torch.distributed calls for backend "trident" (its extended API)."""
    if backend_options is not None and not isinstance(backend_options, Options):
        raise TypeError(f"pg_options of backend 'trident' must be a "
                        f"trident.torch.backend.Options, got {type(backend_options).__name__}")
    return TridentProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                               str(opts.group_id), list(opts.global_ranks_in_group),
                               backend_options or Options())


class TridentProcessGroup(dist.ProcessGroup):
    """See the module docstring. Attributes: inner (the inner group), fallbacks (a Counter
    of the ops that went to it), context_error (why the group has no trident context, or
    None)."""

    def __init__(self, store, rank: int, size: int, timeout, name: str,
                 global_ranks: list[int], options: Options):
        super().__init__(rank, size)
        self._name, self._size, self._options = name, size, options
        self._on_gpu = not _env.INTERPRET
        self._ours = operator.attrgetter("is_cuda" if self._on_gpu else "is_cpu")
        if self._on_gpu:
            _share_gpu_before_cuda(size)
        self.inner = inner.make(store, rank, size, timeout, name, global_ranks)
        self._ctx = None
        self.context_error = None
        # allreduce's shortcuts to the context's plans (PlanCache.shortcuts), and what the
        # hot path reads of the context: its device error word, whether it is capturing
        self._hot: dict = {}
        self._hot_get, self._error, self._capturing = self._hot.get, (0,), _not_capturing
        self.fallbacks: Counter = Counter()
        self._device_index = 0
        # the previous trident call's stream: its raw handle, and (Stream, capturing)
        self._stream, self._last = None, None

    # ------------------------------------------------------------------ identity
    @property
    def group_name(self) -> str:
        return self._name

    @property
    def pg_name(self) -> str:
        return self._name

    def getBackendName(self) -> str:       # noqa: N802  (torch's name)
        return "trident"

    def _get_backend(self, device):
        """The C++ backend behind `device`'s tensors for torch's own plumbing (splits,
        shutdown): the inner group's."""
        return self.inner._get_backend(device)

    def __repr__(self) -> str:
        return (f"TridentProcessGroup(name={self._name!r}, rank={self.rank()}, "
                f"size={self._size}, fallback={inner.describe(self.inner)})")

    # ------------------------------------------------------------------ the context
    def context(self):
        """This group's trident Context, made at the first call (collective over the
        group); None where the group has none (context_error says why)."""
        return self._ctx or self._make_context()

    def _make_context(self):
        if self.context_error is not None:
            return None
        if self._on_gpu and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the first collective that trident serves on a process group "
                               "maps its heap and cannot be captured into a CUDA graph; run "
                               "one collective (or trident.torch.backend.context(group)) "
                               "before capturing")
        from .make_context import make_context
        self._ctx, self.context_error = make_context(self.inner, self._options)
        ctx = self._ctx
        if ctx is not None:
            if self._on_gpu:
                self._device_index = ctx.device.index
            self._hot = ctx.plans.shortcuts()
            self._hot_get, self._error = self._hot.get, ctx.plans.error_word
            self._capturing = ctx.capturing
        return ctx

    def _ready(self):
        """The context, its kernels ordered after the previous call's (GPUs); None where
        the group has none (the call falls back)."""
        ctx = self._ctx or self._make_context()
        if ctx is not None and self._on_gpu:
            self._in_order()
        return ctx

    def _in_order(self) -> None:
        """GPUs: order this call's kernels after the group's previous trident call when it
        was made on another stream (module docstring, "One order on the GPU")."""
        if _raw_stream(self._device_index) != self._stream:
            stream = torch.cuda.current_stream(self._device_index)
            capturing = torch.cuda.is_current_stream_capturing()
            if self._last is not None and self._last[1] == capturing:
                event = torch.cuda.Event()
                event.record(self._last[0])
                stream.wait_event(event)
            self._stream, self._last = stream.cuda_stream, (stream, capturing)

    def _done(self, opts, result):
        return issued(result, self._on_gpu) if opts is not None and opts.asyncOp else DONE

    def _fall(self, op: str, fn, *args):
        """Hand `op` to the inner group. Where trident serves `op` for other inputs (not
        FALLBACK_OPS) and the group has a context, every rank agrees first that it falls
        back (fallback.py: one host round trip), so that a rank falling back alone raises
        CallMismatch on every rank at once instead of a wait on each side to its timeout."""
        self.fallbacks[op] += 1
        if self._ctx is not None and op not in FALLBACK_OPS:
            fallback.agree(self._ready(), op, args)
        return fn(*args)

    # ------------------------------------------------------------------ collectives
    def allreduce(self, tensors, opts):
        # dist.all_reduce's hot path. SUM is found with one comparison (reading the op's
        # type and hashing it costs ~1 us in pybind); a warm SUM then runs the plan that
        # ctx.all_reduce(t) runs, through a shortcut keyed by what that plan depends on
        # (ctx.all_reduce's key less its defaults), skipping trident's call layers. The
        # shortcut is taken only where ctx.all_reduce would run that plan: no device error
        # pending (it raises on the slow path), not in debug mode (which checks every call).
        # A plain tensor at an address the shortcuts have not seen takes its plain key's
        # (trident's plan of plain tensors: ccl._plain_key), where its address is not on
        # the heap (a heap tensor's plan is its address's).
        red = opts.reduceOp
        if red == _SUM:
            if len(tensors) == 1:
                t = tensors[0]
                p = t.data_ptr()
                run = self._hot_get((p, t.shape, t.stride(), t.dtype, self._capturing()))
                if run is None and self._hot and not self._ctx.in_heap(p):
                    run = self._hot_get((*plain_key(t), self._capturing()))
                if run is not None and not self._error[0] and not self._ctx.debug:
                    if self._on_gpu and _raw_stream(self._device_index) != self._stream:
                        self._in_order()
                    run((t,))
                    return issued(tensors, self._on_gpu) if opts.asyncOp else DONE
            op = "sum"
        else:
            op = _REDUCE.get(red.op.value)
        if op is not None and len(tensors) == 1:
            t = tensors[0]
            if _serves(op, t.dtype) and self._ours(t):
                ctx = self._ready()
                if ctx is not None:
                    ctx.all_reduce(t, op)
                    if op is _AVG:
                        t.div_(self._size)
                    elif t.data_ptr() and not ctx.debug:
                        self._shortcut(ctx, t)
                    return issued(tensors, self._on_gpu) if opts.asyncOp else DONE
        return self._fall("all_reduce", self.inner.allreduce, tensors, opts)

    def _shortcut(self, ctx, t) -> None:
        """Keep a shortcut to the plan ctx.all_reduce(t) just ran (allreduce's hot path)."""
        from ...ccl import all_reduce_plan
        plan, plain = all_reduce_plan(ctx, t)
        if plan is not None:
            key = plain_key(t) if plain else (t.data_ptr(), t.shape, t.stride(), t.dtype)
            self._hot[(*key, ctx.capturing())] = plan.run

    def allreduce_coalesced(self, tensors, opts):
        op = _op_of(opts)
        if op is not None and tensors and all(_serves(op, t.dtype) and self._ours(t)
                                              for t in tensors):
            ctx = self._ready()
            if ctx is not None:
                for t in tensors:
                    ctx.all_reduce(t, op)
                    if op is _AVG:
                        t.div_(self._size)
                return self._done(opts, tensors)
        return self._fall("all_reduce_coalesced", self.inner.allreduce_coalesced, tensors, opts)

    def all_gather_single(self, output, input, opts=None):
        if self._ours(input) and self._ours(output):
            ctx = self._ready()
            if ctx is not None:
                _check_numel(ctx, output, input, "all_gather_into_tensor")
                ctx.all_gather(*_flat(ctx, "all_gather_into_tensor", output, input))
                return self._done(opts, [output])
        return self._fall("all_gather_into_tensor", self.inner._allgather_base, output, input,
                          *_given(opts))

    _allgather_base = all_gather_single          # the name torch 2.11 calls

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        if all(self._ours(t) for t in (*outputs, *inputs)):
            ctx = self._ready()
            if ctx is not None:
                for out, inp in zip(outputs, inputs, strict=True):
                    _check_numel(ctx, out, inp, "all_gather_into_tensor")
                    ctx.all_gather(*_flat(ctx, "all_gather_into_tensor", out, inp))
                return self._done(opts, list(outputs))
        return self._fall("all_gather_into_tensor", self.inner.allgather_into_tensor_coalesced,
                          outputs, inputs, *_given(opts))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather(self, output_lists, inputs, opts=None):
        if len(inputs) == 1 and len(output_lists) == 1 and len(output_lists[0]) == self._size:
            inp, outs = inputs[0], output_lists[0]
            if self._ours(inp) and all(self._ours(o) and o.dtype == inp.dtype and
                                       o.numel() == inp.numel() for o in outs):
                ctx = self._ready()
                if ctx is not None:
                    flat = torch.empty(self._size * inp.numel(), dtype=inp.dtype,
                                       device=inp.device)
                    ctx.all_gather(flat, *_flat(ctx, "all_gather", inp))
                    for out, part in zip(outs, flat.chunk(self._size)):
                        out.copy_(part.view(out.shape))
                    return self._done(opts, output_lists)
        return self._fall("all_gather", self.inner.allgather, output_lists, inputs,
                          *_given(opts))

    def reduce_scatter_single(self, output, input, opts):
        op = _op_of(opts)
        if _serves(op, input.dtype) and self._ours(input) and self._ours(output):
            ctx = self._ready()
            if ctx is not None:
                _check_numel(ctx, input, output, "reduce_scatter_tensor", "input")
                ctx.reduce_scatter(*_flat(ctx, "reduce_scatter_tensor", output, input), op)
                if op is _AVG:
                    output.div_(self._size)
                return self._done(opts, [output])
        return self._fall("reduce_scatter_tensor", self.inner._reduce_scatter_base, output,
                          input, opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        op = _op_of(opts)
        if op is not None and all(_serves(op, t.dtype) and self._ours(t)
                                  for t in (*outputs, *inputs)):
            ctx = self._ready()
            if ctx is not None:
                for out, inp in zip(outputs, inputs, strict=True):
                    _check_numel(ctx, inp, out, "reduce_scatter_tensor", "input")
                    ctx.reduce_scatter(*_flat(ctx, "reduce_scatter_tensor", out, inp), op)
                    if op is _AVG:
                        out.div_(self._size)
                return self._done(opts, list(outputs))
        return self._fall("reduce_scatter_tensor", self.inner.reduce_scatter_tensor_coalesced,
                          outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(self, outputs, input_lists, opts):
        op = _op_of(opts)
        if (op is not None and len(outputs) == 1 and len(input_lists) == 1
                and len(input_lists[0]) == self._size):
            out, ins = outputs[0], input_lists[0]
            if _serves(op, out.dtype) and self._ours(out) and all(
                    self._ours(i) and i.dtype == out.dtype and i.numel() == out.numel()
                    for i in ins):
                ctx = self._ready()
                if ctx is not None:
                    flat = torch.cat([i.reshape(-1) for i in ins])
                    ctx.reduce_scatter(*_flat(ctx, "reduce_scatter", out), flat, op)
                    if op is _AVG:
                        out.div_(self._size)
                    return self._done(opts, outputs)
        return self._fall("reduce_scatter", self.inner.reduce_scatter, outputs, input_lists, opts)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        if self._ours(input) and self._ours(output) and input.dim() and output.dim():
            ctx = self._ready()
            if ctx is not None:
                ctx.all_to_all(output, input, list(output_splits) or None,
                               list(input_splits) or None)
                return self._done(opts, [output])
        return self._fall("all_to_all_single", self.inner.alltoall_base, output, input,
                          output_splits, input_splits, *_given(opts))

    alltoall_base = all_to_all_single

    def broadcast(self, tensors, opts):
        if len(tensors) == 1 and self._ours(tensors[0]):
            ctx = self._ready()
            if ctx is not None:
                ctx.broadcast(tensors[0], opts.rootRank)
                return self._done(opts, tensors)
        return self._fall("broadcast", self.inner.broadcast, tensors, opts)

    def barrier(self, opts=None):
        """trident's host barrier once the group has a context (the device's work done,
        every rank's errors raised on every rank), else the inner group's."""
        if self._ctx is not None:
            self._ctx.barrier()
            return DONE
        return self.inner.barrier(*_given(opts))

    # ------------------------------------------------------------------ fallback only
    def alltoall(self, outputs, inputs, opts=None):
        return self._fall("all_to_all", self.inner.alltoall, outputs, inputs, *_given(opts))

    def gather(self, outputs, inputs, opts):
        return self._fall("gather", self.inner.gather, outputs, inputs, opts)

    def scatter(self, outputs, inputs, opts):
        return self._fall("scatter", self.inner.scatter, outputs, inputs, opts)

    def reduce(self, tensors, opts):
        return self._fall("reduce", self.inner.reduce, tensors, opts)

    def send(self, tensors, dst: int, tag: int = 0):
        return self._fall("send", self.inner.send, tensors, dst, tag)

    def recv(self, tensors, src: int, tag: int = 0):
        return self._fall("recv", self.inner.recv, tensors, src, tag)

    def recv_anysource(self, tensors, tag: int = 0):
        return self._fall("recv", self.inner.recv_anysource, tensors, tag)

    # ------------------------------------------------------------------ lifetime
    def shutdown(self) -> None:
        """destroy_process_group: close the context (a barrier over the inner group, which
        torch shuts down after this one)."""
        ctx, self._ctx = self._ctx, None
        self.context_error = "the process group was destroyed"
        if ctx is not None:
            ctx._closing_as = "destroy_process_group"     # what a peer's error names
            ctx.close()


def _not_capturing() -> bool:
    return False


def _raw_stream(device_index: int) -> int:
    """The current CUDA stream's handle (one C call)."""
    return torch._C._cuda_getCurrentRawStream(device_index)


def _serves(op, dtype) -> bool:
    """Whether trident reduces `dtype` under `op` (trident's name, or None: not one it
    has): the dtypes of trident/ccl/common.py REDUCE_DTYPES (read on first use, so that
    `import trident` does not import the kernels), AVG on floating types only (an integer
    tensor cannot take the division; the inner group averages it)."""
    global _REDUCIBLE
    if _REDUCIBLE is None:
        from ...ccl.common import REDUCE_DTYPES
        _REDUCIBLE = frozenset(REDUCE_DTYPES)
    return (op is not None and dtype in _REDUCIBLE
            and (op is not _AVG or dtype.is_floating_point))


def _op_of(opts) -> str | None:
    """trident's name of opts.reduceOp (_AVG for AVG), or None where trident has none."""
    red = opts.reduceOp
    return "sum" if red == _SUM else _REDUCE.get(red.op.value)


def _given(opts) -> tuple:
    return () if opts is None else (opts,)


def _flat(ctx, op: str, *ts: torch.Tensor) -> list:
    """Each of `ts` as one dimension (views; contiguous tensors only, as NCCL requires)."""
    for t in ts:
        if not t.is_contiguous():
            raise ctx.fail_call(op, ValueError(
                f"trident backend: {op}: tensors must be contiguous (as with NCCL), got "
                f"shape {list(t.shape)} with strides {list(t.stride())}"))
    return [t.view(-1) for t in ts]


def _check_numel(ctx, big, small, op: str, which: str = "output") -> None:
    """The sizes of a gather or scatter, checked before the call goes to `ctx`; a bad one
    on this rank alone stops its peers' call at once (Context.fail_call)."""
    if big.numel() != ctx.world_size * small.numel():
        raise ctx.fail_call(op, ValueError(
            f"{op}: the {which} tensor must hold world_size ({ctx.world_size}) times the "
            f"elements of the other ({small.numel()}), got {big.numel()}"))


def _share_gpu_before_cuda(size: int) -> None:
    """Ranks of this host that share GPUs (torchrun's LOCAL_WORLD_SIZE above the GPUs)
    need their MPS share set before CUDA starts here (trident/runtime/placement.py), as
    trident.init does."""
    from ...runtime import options, placement
    local = options.get("LOCAL_WORLD_SIZE", 0)
    if local:
        placement.ensure_share(placement.ranks_on_my_gpu(
            local, torch.cuda.device_count(), options.get("LOCAL_RANK", 0)))


__all__ = ["TridentProcessGroup", "TridentWork", "Options", "create", "TRIDENT_OPS",
           "FALLBACK_OPS"]
