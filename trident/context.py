"""Context: one rank's view of the job -- rank, world size, device, the symmetric heap."""
from __future__ import annotations

import datetime
import hashlib
import math
import os
import pickle
import socket
import uuid
import weakref

import torch
import torch.distributed as dist

from . import _env, placement
from .errors import CommTimeout, HeapMismatchError, decode_timeout
from .heap.allocator import Allocator, HeapFullError
from .language import sync as _sync
from .plans import PlanCache

# Host-side copies of the control-block layout (the device side uses tl.constexpr).
CTRL_ERROR, CTRL_TIMEOUT, CTRL_WORDS, MAX_RANKS = (
    int(getattr(c, "value", c)) for c in (_sync.CTRL_ERROR, _sync.CTRL_TIMEOUT, _sync.CTRL_WORDS,
                                          _sync.MAX_RANKS))

DEFAULT_HEAP_SIZE = 1 << 30
DEFAULT_TIMEOUT_S = 30.0

# Host-side collectives of a context (barrier, workspace creation, debug-mode agreement
# checks, reset) all begin with one all_gather of a header of this fixed size: which call
# it is (name, step number, a digest of its details) and a payload. Any two of them pair
# up in the transport, so ranks that made different calls find out from the headers and
# every rank raises an error that names each rank's call (gloo aborts the process when
# two collectives of different sizes meet).
_HEADER_MAGIC = 0x7472696465_6E74      # "trident"
_NAME_WORDS = 4                         # 32 bytes of the call's name
_PAYLOAD_WORDS = 9
_HEADER_WORDS = 3 + _NAME_WORDS + _PAYLOAD_WORDS


class CallMismatchError(RuntimeError):
    """Ranks made different host-side collective calls at the same point (a rank skipped
    or reordered a trident call): the message names each rank's call."""


class HostTimeout(CommTimeout):
    """A host-side collective (barrier, workspace creation, debug check) did not hear from
    every rank within the context's timeout: a rank skipped the call, failed before it or
    died. The process group cannot be used afterwards."""

    def __init__(self, op: str, rank: int, timeout_s: float, detail: str = ""):
        self.op, self.rank, self.peer, self.timeout_s, self.detail = op, rank, None, timeout_s, detail
        RuntimeError.__init__(
            self, f"rank {rank}: {op} (a host-side collective) failed: another rank did not "
                  f"join it within {timeout_s:g} s (it skipped this call, failed before it or "
                  f"died)" + (f" [transport: {detail}]" if detail else ""))

    def __reduce__(self):
        return HostTimeout, (self.op, self.rank, self.timeout_s, self.detail)


def _digest(obj) -> int:
    return int.from_bytes(hashlib.blake2b(repr(obj).encode(), digest_size=8).digest(),
                          "little", signed=True)


def _name_words(name: str) -> list[int]:
    raw = name.encode()[:8 * _NAME_WORDS].ljust(8 * _NAME_WORDS, b"\0")
    return [int.from_bytes(raw[i:i + 8], "little", signed=True) for i in range(0, len(raw), 8)]


def _words_name(words) -> str:
    return b"".join(int(w).to_bytes(8, "little", signed=True) for w in words).rstrip(b"\0") \
        .decode(errors="replace")


def _not_capturing() -> bool:
    return False


def _ccl():
    """trident.ccl, imported on first use (an import statement per call costs ~0.5 us)."""
    global _ccl_module
    if _ccl_module is None:
        from . import ccl
        _ccl_module = ccl
    return _ccl_module


def _ops():
    global _ops_module
    if _ops_module is None:
        from . import ops
        _ops_module = ops
    return _ops_module


_ccl_module = _ops_module = None
_CONTEXTS_MADE: dict[str, int] = {}     # contexts made per process group (Context.name)


class _Building:
    def __init__(self, ctx, name):
        self.ctx, self.name = ctx, name

    def __enter__(self):
        self.prev, self.ctx._calling = self.ctx._calling, self.name

    def __exit__(self, *exc):
        self.ctx._calling = self.prev


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


class Context:
    """Created by `trident.init`; holds the heap and offers the collectives and ops.

    Attributes: rank, world_size, device, backend ("cuda" or "cpu"), heap_size,
    topology (trident.topology.Topology: one node, set by trident.init; None otherwise),
    ranks_per_device (ranks of the group on this rank's GPU; 1 on the CPU emulation),
    heap_bases (int64 tensor on `device`: where each rank's heap lives in this process),
    ctrl (this rank's control block: error word, timeout, barrier epoch and flags),
    trace_buffer (the event buffer of the active `ctx.trace(...)` session, else None: set
    by trident.trace, read by ops through trident.trace.kernel_args).
    """

    topology = None
    spans_nodes = False          # trident.world.WorldContext: True

    def __init__(self, heap_size: int | None = None, group=None, timeout: float | None = None,
                 debug: bool | None = None):
        if not dist.is_initialized():
            raise RuntimeError("trident.init needs torch.distributed to be initialised first "
                               "(dist.init_process_group), or start ranks with trident.launch")
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        if self.world_size > MAX_RANKS:
            raise ValueError(f"trident supports up to {MAX_RANKS} ranks, got {self.world_size}")
        self.heap_size = heap_size or _env_int("TRIDENT_HEAP_SIZE", DEFAULT_HEAP_SIZE)
        self.debug = bool(int(os.environ.get("TRIDENT_DEBUG", "0"))) if debug is None else debug
        self.backend = "cpu" if _env.INTERPRET else "cuda"
        if self.backend == "cuda":
            gpus = torch.cuda.device_count()
            self.device = torch.device("cuda", placement.device_index(
                _env_int("LOCAL_RANK", dist.get_rank()), gpus))     # the job's rank
            torch.cuda.set_device(self.device)
            self.ranks_per_device = self._count_ranks_on_device()
            placement.set_ranks_per_device(self.ranks_per_device)
            if self.ranks_per_device > 1:
                # torch symmetric memory refuses peers on one device unless told
                os.environ["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
            from .heap.cuda import CudaHeap
            self._heap = CudaHeap(self.heap_size, self.rank, self.world_size, self.group,
                                  self.device)
        else:
            from . import emulation
            from .heap.cpu import CpuHeap
            emulation.install()
            self.device = torch.device("cpu")
            self.ranks_per_device = 1
            self._heap = CpuHeap(self.heap_size, self.rank, self.world_size, self.group,
                                 self._job_id())
        self._closed = False
        self._host_step = 0          # host-side collectives made since init / reset
        self._calling = None         # the public op running now (for error messages)
        self.trace_buffer = None     # set while a trace session is active (trident/trace)
        # launch plans of this context's calls (trident/plans.py), and whether the current
        # stream is being captured into a CUDA graph (selection differs there)
        # (torch.cuda.is_current_stream_capturing's C function: one Python frame less per call)
        self.capturing = (getattr(torch._C, "_cuda_isCurrentStreamCapturing",
                                  torch.cuda.is_current_stream_capturing)
                          if self.backend == "cuda" else _not_capturing)
        self.plans = PlanCache(
            graphs=os.environ.get("TRIDENT_PLAN_GRAPHS", "multi") if self.backend == "cuda"
            else "off", capturing=self.capturing)
        self._workspaces: dict = {}
        self._resettable: list = []
        self._persistent: set[int] = set()
        self._heap_ptr = self._heap.local.data_ptr()
        self.allocator = Allocator(self.heap_size)
        self.heap_bases = torch.tensor(self._heap.bases, dtype=torch.int64, device=self.device)
        self.ctrl = self.zeros(CTRL_WORDS, dtype=torch.int64)
        self._persistent.add(0)
        self.set_timeout(DEFAULT_TIMEOUT_S if timeout is None else timeout)
        self.barrier()
        self._register_name()

    def _count_ranks_on_device(self) -> int:
        """How many ranks of the group use this rank's GPU (same host, same GPU UUID). Over
        an NCCL group they are 1 by construction (NCCL refuses two ranks on one device, so
        a group that works has none), checked up front through LOCAL_WORLD_SIZE where
        torchrun sets it, since NCCL's own error comes late and says less."""
        gpus = torch.cuda.device_count()
        if dist.get_backend(self.group) != "gloo":
            local = _env_int("LOCAL_WORLD_SIZE", 0)
            if local > gpus:
                raise ValueError(
                    f"{local} ranks on this host and {gpus} GPU(s): ranks share GPUs, which "
                    f"NCCL cannot serve; initialise the process group with backend 'gloo' "
                    f"(trident.init does under torchrun when ranks outnumber GPUs) and run an "
                    f"MPS daemon (nvidia-cuda-mps-control -d)")
            return 1
        me = (socket.gethostname(), str(torch.cuda.get_device_properties(self.device).uuid))
        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, me, group=self.group)
        return everyone.count(me)

    @property
    def shares_device(self) -> bool:
        """True when other ranks of this context use the same GPU (see trident/placement.py)."""
        return self.ranks_per_device > 1

    @property
    def nccl_available(self) -> bool:
        """Whether the "nccl" algorithm (torch.distributed collectives on this context's
        tensors) can run: not on GPUs whose ranks share a GPU, where the group is gloo."""
        return self.backend == "cpu" or not self.shares_device

    @property
    def usable_sms(self) -> int | None:
        """SMs this rank's grids may fill (its share of the GPU; None on the CPU emulation)."""
        return placement.usable_sms(self.device) if self.backend == "cuda" else None

    @property
    def heap_mapping(self) -> str:
        """How the peers' heaps are mapped into this process (for `trident info`, logs)."""
        if self.backend == "cpu":
            return "CPU emulation: one /dev/shm file per rank, mapped by every rank"
        shared = (f"; {self.ranks_per_device} ranks share each GPU (torch's "
                  f"TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1, set by trident)"
                  if self.shares_device else "")
        return ("torch symmetric memory (CUDA virtual memory handles exchanged over the "
                "process group, peers mapped through NVLink peer access)" + shared)

    def _register_name(self) -> None:
        """`name`: how trident's torch custom ops (trident/torch_ops.py) find this context
        in a compiled graph -- the group's name and the number of contexts made on it before
        (the same on every rank, since every rank makes the same contexts in order), and the
        world size, which the ops' fake implementations read (a compiled graph in Inductor's
        disk cache is found by the names in it: see trident/torch_ops.py)."""
        from . import torch_ops
        group = getattr(self.group, "group_name", "") or "world"
        made = _CONTEXTS_MADE.get(group, 0)
        self.name = f"trident:{group}:{made}:world{self.world_size}"
        _CONTEXTS_MADE[group] = _CONTEXTS_MADE.get(group, 0) + 1
        torch_ops.register(self)

    def _job_id(self) -> str:
        job = [os.environ.get("TRIDENT_JOB_ID") or uuid.uuid4().hex[:12]]
        if self.world_size != dist.get_world_size():    # a node of several: one file set each
            job[0] += f"-g{dist.get_global_rank(self.group, 0)}"
        dist.broadcast_object_list(job, src=dist.get_global_rank(self.group, 0), group=self.group)
        return job[0]

    # ------------------------------------------------------------------ allocation
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

    def heap_offset(self, t: torch.Tensor) -> int:
        """Byte offset of heap tensor `t` from this rank's heap base: where its copy lies in
        every peer's heap too (translate: peer base + offset)."""
        return t.data_ptr() - self._heap_ptr

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

    # ------------------------------------------------------------------ synchronisation
    @property
    def host_timeout_s(self) -> float:
        """Limit of a host-side collective: the device timeout plus 5 s, since a peer may
        reach it only after one of its device waits has timed out."""
        return self.timeout_s + 5.0

    def set_timeout(self, seconds: float) -> None:
        """Limit of every device-side wait. Past it, the wait gives up and CommTimeout follows."""
        if seconds <= 0:
            raise ValueError(f"timeout must be positive, got {seconds}")
        self.timeout_s = float(seconds)
        self.ctrl[CTRL_TIMEOUT] = int(seconds * 1e9)

    def sync(self) -> None:
        """Wait for this rank's queued device work; raise CommTimeout if a wait timed out,
        else ValueError if a kernel recorded a bad input value (e.g. an MoE expert id)."""
        self._check_open()
        if self.backend == "cuda":
            torch.cuda.synchronize(self.device)
        timeout, value = self._error_words()
        self._raise_if_timed_out(timeout)
        self._raise_value_error(value)

    def _raise_if_timed_out(self, word: int) -> None:
        if word:
            self.ctrl[CTRL_ERROR] = 0
            op, rank, peer = decode_timeout(word)
            raise CommTimeout(op, rank, peer, self.timeout_s)

    def _error_words(self) -> tuple[int, list[int]]:
        """This rank's timeout word and bad-value record (kind, 4 words; see
        language/sync.py), read in one device->host copy after the device work is done."""
        first = int(_sync.CTRL_VALUE_ERROR)
        words = self.ctrl[:first + 5].tolist()
        return words[CTRL_ERROR], words[first:]

    def _raise_value_error(self, record: list[int], rank: int | None = None) -> None:
        """Raise a bad value that a kernel recorded (and dropped) as ValueError: this rank's
        own record (cleared first), or rank `rank`'s as the barrier saw it."""
        if record[0]:
            from .errors import value_error_message
            if rank is None:
                first = int(_sync.CTRL_VALUE_ERROR)
                self.ctrl[first:first + 5] = 0
            raise ValueError(value_error_message(record[0], record[1:],
                                                 self.rank if rank is None else rank))

    def after_op(self) -> None:
        """Called by every op after its launch: in debug mode, synchronise and check errors
        (not while a CUDA graph is captured: a sync there invalidates the capture)."""
        if self.debug and not self.capturing():
            self.sync()

    def barrier(self) -> None:
        """Host barrier: finishes device work, checks every rank's error words (timeouts
        raise CommTimeout, bad input values that kernels recorded raise ValueError, on every
        rank) and that all ranks made the same heap allocations, then synchronises the ranks.
        A rank that made another host-side call meanwhile (an op's first call, a debug
        check) makes every rank raise CallMismatchError; one that never comes, HostTimeout
        after the context's timeout."""
        self._barrier("barrier")

    def _barrier(self, what: str, detail=None, failed: int = 0):
        """The barrier's checks under the header `what`; returns every rank's `failed`
        word and, when the ranks' `detail`s differ, the list of them (else None). When a
        rank failed or the details differ, it returns before checking the heap and the
        error words (the caller undoes its step on every rank first)."""
        self._check_open()
        if self.backend == "cuda":
            torch.cuda.synchronize(self.device)
        timeout, value = self._error_words()
        try:
            table, details = self.host_exchange(
                what, [self.allocator.digest(), timeout, *value, failed], detail=detail)
        except HostTimeout:
            self._raise_if_timed_out(timeout)    # a wait of this rank's that timed out says more
            raise
        failed = [row[7] for row in table]
        if details is not None or any(failed):
            return failed, details               # the caller rolls back on every rank
        digests = [row[0] for row in table]
        errors = [row[1] for row in table]
        values = [row[2:7] for row in table]
        if len(set(digests)) > 1:
            self._raise_heap_mismatch(digests)
        self.allocator.log.clear()
        if errors[self.rank]:
            self._raise_if_timed_out(errors[self.rank])
        for word in errors:
            if word:
                op, rank, peer = decode_timeout(word)
                raise CommTimeout(op, rank, peer, self.timeout_s)
        # a bad input value on any rank: every rank raises (its own record first), so
        # that callers that go on to collective work (frees) stay in step
        self._raise_value_error(value)
        for rank, record in enumerate(values):
            self._raise_value_error(record, rank)
        return failed, details

    def agree(self, op: str, *signature) -> None:
        """Debug mode's check before an op: raise ValueError if the ranks called `op` with
        different sizes (`signature`: what must be equal everywhere), CallMismatchError
        (naming each rank's call) if a rank is in another call. One fixed-size host
        exchange, which a peer's barrier or other check cannot be confused with."""
        _, everyone = self.host_exchange(op, detail=signature)
        for rank, theirs in enumerate(everyone or ()):
            if theirs != signature:
                raise ValueError(f"{op}: rank {self.rank} called with {signature} but rank "
                                 f"{rank} with {theirs}; every rank must pass the same sizes")

    def host_exchange(self, what: str, payload=(), detail=None, check_step: bool = True):
        """One host-side collective: every rank sends a fixed-size header (the call's name
        `what`, its step number since init/reset, a digest of `detail`) and up to
        9 int64 payload words; returns (every rank's payload words, the ranks' `detail`s
        if they differ, else None).

        Raises, on every rank alike, CallMismatchError naming each rank's call when the
        ranks are not in the same call; HostTimeout when a rank does not come within the
        context's timeout."""
        self._check_open()
        payload = [int(p) for p in payload]
        if len(payload) > _PAYLOAD_WORDS:
            raise AssertionError(f"host_exchange payload of {len(payload)} words")
        step = self._host_step
        self._host_step += 1
        mine = torch.tensor([_HEADER_MAGIC, step, _digest(detail), *_name_words(what),
                             *payload, *[0] * (_PAYLOAD_WORDS - len(payload))], dtype=torch.int64)
        table = self._all_gather_header(mine, lambda: self._describe_call(what, detail))
        if any(row[0] != _HEADER_MAGIC for row in table):
            bad = [r for r, row in enumerate(table) if row[0] != _HEADER_MAGIC]
            raise CallMismatchError(
                f"{what}: rank {self.rank}'s host-side collective met another kind of "
                f"collective on rank(s) {bad} (a torch.distributed call?); the ranks are out "
                f"of step")
        names = [_words_name(row[3:3 + _NAME_WORDS]) for row in table]
        steps = [row[1] for row in table]
        if len(set(names)) > 1 or (check_step and len(set(steps)) > 1):
            calls = [None] * self.world_size
            dist.all_gather_object(calls, self._describe_call(what, detail), group=self.group)
            lines = "; ".join(f"rank {r} called {c} (its host-side call #{steps[r]})"
                              for r, c in enumerate(calls))
            raise CallMismatchError(
                f"ranks made different calls at the same point: {lines}. Every rank must "
                f"make the same trident calls in the same order (did a rank skip one?)")
        details = None
        if len({row[2] for row in table}) > 1:
            details = [None] * self.world_size
            dist.all_gather_object(details, detail, group=self.group)
        return [row[3 + _NAME_WORDS:] for row in table], details

    def _describe_call(self, what: str, detail) -> str:
        if what == "workspace":
            return f"{self._op_phrase()} (a call that creates the workspace {detail!r})"
        if what in ("barrier", "reset"):
            return f"ctx.{what}()"
        return what if detail is None else f"{what} with {detail}"

    def _all_gather_header(self, mine: torch.Tensor, describe) -> list[list[int]]:
        """all_gather of the header, bounded by the host timeout; describe() names the
        call in the error."""
        everyone = [torch.empty_like(mine) for _ in range(self.world_size)]
        try:
            if dist.get_backend(self.group) == "gloo":
                from torch._C._distributed_c10d import AllgatherOptions
                opts = AllgatherOptions()
                opts.timeout = datetime.timedelta(seconds=self.host_timeout_s)
                backend = self.group._get_backend(torch.device("cpu"))
                backend.allgather([everyone], [mine], opts).wait()
            else:
                device = [t.to(self.device) for t in everyone]
                dist.all_gather(device, mine.to(self.device), group=self.group)
                everyone = device
        except RuntimeError as e:
            raise HostTimeout(describe(), self.rank, self.host_timeout_s,
                              str(e).strip()[:200]) from None
        return torch.stack(everyone).tolist()        # one device->host copy

    def _raise_heap_mismatch(self, digests: list[int]) -> None:
        logs = [None] * self.world_size
        dist.all_gather_object(logs, list(self.allocator.log), group=self.group)
        ref = 0
        other = next(r for r in range(self.world_size) if digests[r] != digests[ref])
        a, b = logs[ref], logs[other]
        i = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
        req_a = a[i] if i < len(a) else "(nothing)"
        req_b = b[i] if i < len(b) else "(nothing)"
        raise HeapMismatchError(
            f"symmetric heap allocations differ between rank {ref} and rank {other}: request "
            f"#{i} since the last barrier was '{req_a}' on rank {ref} but '{req_b}' on rank "
            f"{other}. Every rank must allocate and free the same sizes in the same order.")

    def device_barrier(self) -> None:
        """Stream-ordered barrier across ranks (one tiny kernel; CUDA-graph capturable)."""
        from .ccl.barrier import device_barrier
        device_barrier(self)
        self.after_op()

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
            error = None
            try:
                obj = factory(self)
            except HeapFullError as e:
                error = e
            made = set(self.allocator.live_offsets()) - before

            def roll_back():
                for offset in made:
                    self.allocator.free(offset)
                self.allocator.restart_log()

            try:
                failed, keys = self._barrier("workspace", detail=key, failed=error is not None)
            except HeapMismatchError as e:
                roll_back()
                raise HeapMismatchError(
                    f"while {self._op_phrase()} created the workspace {key!r}: {e} Did "
                    f"every rank make this call, with the same sizes?") from None
            if keys is not None or any(failed):
                roll_back()
            if keys is not None:
                names = "; ".join(f"rank {r}: {k!r}" for r, k in enumerate(keys))
                raise HeapMismatchError(
                    f"{self._op_phrase()}: the ranks created different workspaces ({names}): "
                    f"their sizes differ. Every rank must call with the same sizes.")
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

    def register_reset(self, obj) -> None:
        """Have ctx.reset() also call obj.reset() (kept as a weak reference): for objects
        with device epochs and flags that are not workspaces, e.g. ExpertParallel."""
        self._resettable.append(weakref.ref(obj))

    def reset(self) -> None:
        """Collective: after a failure, bring error words, epochs and flags back to zero on
        every rank so the context can be used again."""
        if self.backend == "cuda":
            torch.cuda.synchronize(self.device)
        self.host_exchange("reset", check_step=False)
        self._host_step = 0
        self.plans.clear()
        self.ctrl.zero_()
        self.ctrl[CTRL_TIMEOUT] = int(self.timeout_s * 1e9)
        for ws in list(self._workspaces.values()) + [r() for r in self._resettable]:
            if ws is not None and hasattr(ws, "reset"):
                ws.reset()
        if self.backend == "cuda":
            torch.cuda.synchronize(self.device)
        self.host_exchange("reset", check_step=False)
        self._host_step = 0

    # ------------------------------------------------------------------ collectives
    # Each method hands over to its package (imported on first use); see docs/design.md.
    def building(self, name: str):
        """Context manager around a plan's build: names the op in the errors of the host
        collectives it makes (a workspace that does not fit, a rank that skipped the op's
        first call). Only builds pay for it; a warm call does not."""
        return _Building(self, name)

    def all_gather(self, out, inp, **options):
        """out [world*n, ...] = concatenation of every rank's inp [n, ...]."""
        return _ccl().all_gather(self, out, inp, **options)

    def reduce_scatter(self, out, inp, op: str = "sum", **options):
        """out [n, ...] = this rank's block of the sum over ranks of inp [world*n, ...]."""
        return _ccl().reduce_scatter(self, out, inp, op, **options)

    def all_reduce(self, t, op: str = "sum", **options):
        """In place: t = reduction of t over ranks; returns t."""
        return _ccl().all_reduce(self, t, op, **options)

    def all_to_all(self, out, inp, out_splits=None, in_splits=None, **options):
        """Rank r sends rows in_splits[p] of inp to rank p and receives out_splits[p] rows
        from rank p into out, in rank order (None: even splits)."""
        return _ccl().all_to_all(self, out, inp, out_splits, in_splits, **options)

    def broadcast(self, t, src: int = 0, **options):
        """t on every rank = t of rank `src`; returns t."""
        return _ccl().broadcast(self, t, src, **options)

    def all_reduce_add_rmsnorm(self, x, residual, weight, eps: float = 1e-6, **options):
        """Fused: residual += all_reduce_sum(x) (in place); returns
        rmsnorm(residual) * weight, one kernel (trident/ccl/add_rmsnorm.py)."""
        return _ccl().all_reduce_add_rmsnorm(self, x, residual, weight, eps, **options)

    # ------------------------------------------------------------------ fused ops
    def all_gather_matmul(self, a, w, bias=None, **options):
        """all_gather(a, dim 0) @ w.T + bias (column-parallel linear)."""
        return _ops().all_gather_matmul(self, a, w, bias, **options)

    def matmul_reduce_scatter(self, a, w, bias=None, **options):
        """reduce_scatter(a @ w.T, dim 0) + bias (row-parallel linear)."""
        return _ops().matmul_reduce_scatter(self, a, w, bias, **options)

    def matmul_all_reduce(self, a, w, bias=None, **options):
        """all_reduce(a @ w.T) + bias (row-parallel linear)."""
        return _ops().matmul_all_reduce(self, a, w, bias, **options)

    # ------------------------------------------------------------------ tracing
    def trace(self, path: str | None = None, **options):
        """Context manager: record device-side events of the ops inside it, then write
        one Chrome/Perfetto trace merged across ranks."""
        from . import trace
        return trace.session(self, path, **options)

    # ------------------------------------------------------------------ lifetime
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this trident Context is closed")

    def close(self) -> None:
        """Release the heap. Tensors from this context must not be used afterwards."""
        if self._closed:
            return
        try:
            self.barrier()
        finally:
            self._closed = True
            self.plans.clear()
            from . import torch_ops
            torch_ops.unregister(self)
            self.ctrl = self.heap_bases = None
            self._heap.close()

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"trident.Context(rank={self.rank}, world_size={self.world_size}, "
                f"backend={self.backend!r}, device={self.device}, heap_size={self.heap_size}, "
                f"in_use={self.allocator.bytes_in_use})")


def init(heap_size: int | None = None, group=None, timeout: float | None = None,
         debug: bool | None = None) -> Context:
    """Collective over `group` (default: the whole job): map every rank's symmetric heap.

    Under torchrun (RANK/WORLD_SIZE set) the process group is created if it is not yet:
    NCCL with a GPU per rank; gloo when LOCAL_WORLD_SIZE exceeds the visible GPUs, which
    ranks then share round-robin (LOCAL_RANK % GPUs; start an MPS daemon first,
    `nvidia-cuda-mps-control -d`, or every cross-rank wait costs a time slice).
    heap_size defaults to $TRIDENT_HEAP_SIZE or 1 GiB; timeout (seconds) bounds every
    device wait; debug=True checks for timed-out waits after every op.

    Ranks on several nodes (host names, LOCAL_WORLD_SIZE, or TRIDENT_NODE_SIZE=n on one
    machine; trident/topology.py) get a trident.world.WorldContext: the same methods over
    the whole world, with a node-local Context inside (docs/design.md, "Beyond one node").
    """
    if not dist.is_initialized() and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        backend = "gloo"
        if not _env.INTERPRET:
            gpus = torch.cuda.device_count()
            torch.cuda.set_device(placement.device_index(_env_int("LOCAL_RANK", 0), gpus))
            # ranks that outnumber the GPUs share them: NCCL cannot, gloo can
            if _env_int("LOCAL_WORLD_SIZE", 1) <= gpus:
                backend = "nccl"
        dist.init_process_group(backend)
    from . import topology
    # the node and rail groups give up after the host timeout (a node that skips a call)
    layout = topology.discover(group, (DEFAULT_TIMEOUT_S if timeout is None else timeout) + 5.0)
    if layout.spans_nodes:          # a node-local context inside a world of nodes
        from .world import WorldContext
        node = Context(heap_size=heap_size, group=layout.node_group, timeout=timeout,
                       debug=debug)
        node.topology = topology.Topology(layout.node_size, layout.local_rank,
                                          layout.node_size, layout.source)
        return WorldContext(node, layout)
    ctx = Context(heap_size=heap_size, group=group, timeout=timeout, debug=debug)
    ctx.topology = layout
    return ctx
