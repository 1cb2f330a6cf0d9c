"""Context: one rank's view of the job -- rank, world size, device, the symmetric heap.

The runtime's Context is made of four files, each one seam of it (none imports this one):
  context.py        Context's construction (heap backend, device, names), its properties
                    and lifetime (close); the open contexts by name;
  context_heap.py   HeapMethods: tensor factories, free, peer views, workspaces;
  context_sync.py   SyncMethods: timeouts, sync, barrier, agree, reset;
  context_exchange.py  ExchangeMethods: host_exchange, the numbered host collective
                    those are made of, and its one-sided posts.
The Context users hold (trident.Context, trident/api/context.py) is this one with the
families' methods on it (collectives, fused ops, tracing), and trident.init makes it: the
runtime imports none of the families.
"""
from __future__ import annotations

import socket
import uuid
import weakref

import torch
import torch.distributed as dist

from . import _env, options, placement
from .context_exchange import ExchangeMethods
from .context_heap import HeapMethods
from .context_sync import (CTRL_ERROR, CTRL_TIMEOUT, CTRL_WORDS, MAX_RANKS,  # noqa: F401
                           SyncMethods, check_timeout)
# importable from here too (CallMismatchError: CallMismatch's name before issue 41)
from .errors import CallMismatch, CallMismatchError, HostTimeout  # noqa: F401
from .heap.allocator import Allocator
from .plans import PlanCache

DEFAULT_HEAP_SIZE = options.variable("TRIDENT_HEAP_SIZE").default
DEFAULT_TIMEOUT_S = 30.0


def _not_capturing() -> bool:
    return False


def check_init_args(heap_size, timeout) -> None:
    """td.init's heap_size and timeout (None: the default), checked before anything is
    made of them."""
    if heap_size is not None:
        if not isinstance(heap_size, int) or isinstance(heap_size, bool):
            raise TypeError(f"td.init: heap_size must be an int (bytes per rank), got "
                            f"{type(heap_size).__name__} {heap_size!r}")
        if heap_size < 1:
            raise ValueError(f"td.init: heap_size must be a positive number of bytes per "
                             f"rank (None: TRIDENT_HEAP_SIZE or 1 GiB), got {heap_size}")
    if timeout is not None:
        check_timeout(timeout, "td.init: timeout")


_CONTEXTS_MADE: dict[str, int] = {}     # contexts made per process group (Context.name)
# the open contexts of this process by name (Context.name), and what runs when one opens
_OPEN: "weakref.WeakValueDictionary[str, Context]" = weakref.WeakValueDictionary()
_ON_OPEN: list = []


def named(name: str) -> "Context | None":
    """The open Context named `name` in this process, or None."""
    return _OPEN.get(name)


def open_contexts() -> list["Context"]:
    """The open Contexts of this process, in the order they were made."""
    return list(_OPEN.values())


def on_open(hook) -> None:
    """Have hook(ctx) run for every Context made from now on, once it is named (the torch
    layer loads its custom ops then: trident/torch/__init__.py). Idempotent."""
    if hook not in _ON_OPEN:
        _ON_OPEN.append(hook)


class Context(HeapMethods, SyncMethods, ExchangeMethods):
    """The runtime's part of trident.Context (trident/api/context.py adds the collectives,
    fused ops and tracing, and trident.init makes it): rank, world size, device, the heap,
    the control block and the launch plans. Its attributes are listed in trident.Context's
    docstring (trident/api/context.py), for the users who see them there.
    """

    topology = None
    spans_nodes = False          # trident.WorldContext (trident/nodes/world.py): True
    # the name of close()'s host exchange (errors.HOST_CALLS): "destroy_process_group" when
    # the torch backend's shutdown closes the context
    _closing_as = "close"

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
        check_init_args(heap_size, timeout)
        # the TRIDENT_* variables, read once: what this context's code reads instead
        self.options = options.snapshot()
        self.heap_size = heap_size or self.options.heap_size
        self.debug = self.options.debug if debug is None else debug
        self.backend = "cpu" if _env.INTERPRET else "cuda"
        if self.backend == "cuda":
            gpus = torch.cuda.device_count()
            self.device = torch.device("cuda", placement.device_index(
                options.get("LOCAL_RANK", dist.get_rank()), gpus))     # the job's rank
            torch.cuda.set_device(self.device)
            self.ranks_per_device, self._gpu_per_rank = self._count_ranks_on_device()
            placement.set_ranks_per_device(self.ranks_per_device)
            if self.ranks_per_device > 1:
                # torch symmetric memory refuses peers on one device unless told
                options.export("TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES", "1")
            from .heap.cuda import CudaHeap
            self._heap = CudaHeap(self.heap_size, self.rank, self.world_size, self.group,
                                  self.device)
        else:
            from . import emulation
            from .heap.cpu import CpuHeap
            emulation.install()
            self.device = torch.device("cpu")
            self.ranks_per_device, self._gpu_per_rank = 1, True
            self._heap = CpuHeap(self.heap_size, self.rank, self.world_size, self.group,
                                 self._job_id())
        self._closed = False
        self._host_step = 0          # host-side collectives made since init / reset
        self._calling = None         # the public op running now (for error messages)
        self.trace_buffer = None     # set while a trace session is active (trident/trace)
        # launch plans of this context's calls (trident/runtime/plans.py), and whether the current
        # stream is being captured into a CUDA graph (selection differs there)
        # (torch.cuda.is_current_stream_capturing's C function: one Python frame less per call)
        self.capturing = (getattr(torch._C, "_cuda_isCurrentStreamCapturing",
                                  torch.cuda.is_current_stream_capturing)
                          if self.backend == "cuda" else _not_capturing)
        self.plans = PlanCache(
            self.options.plan_cache, capturing=self.capturing,
            graphs=self.options.plan_graphs if self.backend == "cuda" else "off")
        self._workspaces: dict = {}
        self._resettable: list = []
        self._persistent: set[int] = set()
        self._heap_ptr = self._heap.local.data_ptr()
        self.allocator = Allocator(self.heap_size)
        self.heap_bases = torch.tensor(self._heap.bases, dtype=torch.int64, device=self.device)
        self.ctrl = self.zeros(CTRL_WORDS, dtype=torch.int64)
        self._persistent.add(0)
        self.set_timeout(DEFAULT_TIMEOUT_S if timeout is None else timeout)
        self._init_errors()
        # the first barrier; every rank's heap must have one size (a peer's is mapped at
        # this rank's size: a larger one would read past the end of the peer's)
        _, sizes = self._barrier("barrier", detail=("heap_size", self.heap_size))
        if sizes is not None:
            self._heap.close()
            self._closed = True
            raise ValueError(
                "td.init: the ranks' heap sizes differ (" + ", ".join(
                    f"rank {r}: {size} B" for r, (_, size) in enumerate(sizes))
                + "); every rank must pass the same heap_size (or TRIDENT_HEAP_SIZE)")
        self._register_name()

    def _count_ranks_on_device(self) -> tuple[int, bool]:
        """How many ranks of the group use this rank's GPU (same host, same GPU UUID), and
        whether every rank of the group has a GPU of its own (the same on every rank:
        placement.gpu_sharing; nccl_available is it). Over an NCCL group they are 1 and
        True by construction (NCCL refuses two ranks on one device, so a group that works
        has none), checked up front through LOCAL_WORLD_SIZE where torchrun sets it, since
        NCCL's own error comes late and says less. Ranks that share a GPU must run under
        MPS with their share of it as the cap (placement.ensure_share raises otherwise,
        naming what to export)."""
        gpus = torch.cuda.device_count()
        if dist.get_backend(self.group) != "gloo":
            local = options.get("LOCAL_WORLD_SIZE", 0)
            if local > gpus:
                raise ValueError(
                    f"{local} ranks on this host and {gpus} GPU(s): ranks share GPUs, which "
                    f"NCCL cannot serve; initialise the process group with backend 'gloo' "
                    f"(trident.init does under torchrun when ranks outnumber GPUs) and run an "
                    f"MPS daemon (nvidia-cuda-mps-control -d)")
            return 1, True
        me = (socket.gethostname(), str(torch.cuda.get_device_properties(self.device).uuid))
        everyone = [None] * self.world_size
        dist.all_gather_object(everyone, me, group=self.group)
        # ranks on one GPU must each be held to their share of it (trident/runtime/placement.py);
        # CUDA is initialised by now, so a missing cap can only be refused here
        count, alone = placement.gpu_sharing(everyone, me)
        placement.ensure_share(count)
        return count, alone

    @property
    def shares_device(self) -> bool:
        """True when other ranks of this context use the same GPU (see placement.py)."""
        return self.ranks_per_device > 1

    @property
    def nccl_available(self) -> bool:
        """Whether the "nccl" algorithm (torch.distributed collectives on this context's
        tensors) can run: not on GPUs where any ranks of the group share a GPU (the group
        is gloo then, also for a rank alone on its GPU). The same on every rank, so that
        every reader (the selectors, add_rmsnorm, the host group's device) decides alike."""
        return self.backend == "cpu" or self._gpu_per_rank

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
        """`name`: how trident's torch custom ops (trident/torch/ops/) find this context
        in a compiled graph (`named`) -- the group's name and the number of contexts made
        on it before (the same on every rank, since every rank makes the same contexts in
        order), and the world size, which the ops' fake implementations read (a compiled
        graph in Inductor's disk cache is found by the names in it: see
        trident/torch/ops/__init__.py). Then the on_open hooks run."""
        group = getattr(self.group, "group_name", "") or "world"
        made = _CONTEXTS_MADE.get(group, 0)
        self.name = f"trident:{group}:{made}:world{self.world_size}"
        _CONTEXTS_MADE[group] = _CONTEXTS_MADE.get(group, 0) + 1
        _OPEN[self.name] = self
        for hook in _ON_OPEN:
            hook(self)

    def _job_id(self) -> str:
        job = [self.options.job_id or uuid.uuid4().hex[:12]]
        if self.group is not dist.group.WORLD:     # another group: one file set each
            # named by the group (the same on its members, unique in the job): two groups
            # with the same first rank may map their heaps at once
            name = getattr(self.group, "group_name", "") or str(dist.get_global_rank(self.group, 0))
            job[0] += "-g" + "".join(c if c.isalnum() or c in "+-_." else "_" for c in name)
        dist.broadcast_object_list(job, src=dist.get_global_rank(self.group, 0), group=self.group)
        return job[0]

    # ------------------------------------------------------------------ lifetime
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this trident Context is closed")

    def close(self) -> None:
        """Release the heap. Tensors from this context must not be used afterwards.
        Collective. First it raises, on every rank, the first trident error still pending
        (one that a kernel recorded, e.g. a peer that called with other sizes, and that no
        later call has raised yet: it names the call that failed); a failure this rank
        already raised (and did not reset) is not raised again. A peer that makes another
        call meanwhile (a collective, a barrier) makes every rank raise CallMismatch,
        naming each rank's call. The heap is freed in every case."""
        if self._closed:
            return
        seen = self._failure is not None     # raised already: the user knows
        settle = False
        try:
            if not self._peer_closed:     # else no peer is left to meet (context_sync.py)
                self._barrier(self._closing_as)
        except Exception:
            if not seen:
                raise
        finally:
            # every rank met in close (its checks may have raised): gloo needs settling
            settle = (self._barrier_met and not self._peer_closed
                      and dist.get_backend(self.group) == "gloo")
            self._closed = True
            self.plans.clear()
            if _OPEN.get(self.name) is self:
                del _OPEN[self.name]
            self.ctrl = self.heap_bases = None
            self._heap.close()
            if settle:
                self._settle_gloo()

    def _settle_gloo(self) -> None:
        """After close's exchange over a gloo group: wait until gloo's worker has dropped
        the tensors of the group's last collective (see below)."""
        # gloo's worker thread drops a collective's tensors after the caller's wait has
        # returned, and takes the GIL to do it: in a process that exits right after
        # close(), that came after Python had begun to finalise, and the process aborted
        # ("terminate called without an active exception"). One more exchange of the
        # header's size (so a peer in another host call sees a mismatch, not a crash):
        # its enqueue waits while the worker, holding the queue's lock, drops the
        # barrier's tensors; then wait until it has dropped this one's (their refcounts
        # come back down).
        import datetime
        import sys
        import time

        from torch._C._distributed_c10d import AllgatherOptions

        from .context_exchange import _NAME_WORDS, _PAYLOAD_WORDS
        mine = torch.zeros(3 + _NAME_WORDS + _PAYLOAD_WORDS, dtype=torch.int64)
        tensors = [mine, *(torch.empty_like(mine) for _ in range(self.world_size))]
        held = [sys.getrefcount(t) for t in tensors]
        opts = AllgatherOptions()
        opts.timeout = datetime.timedelta(seconds=self.host_timeout_s)
        try:
            self.group._get_backend(torch.device("cpu")).allgather(
                [tensors[1:]], [mine], opts).wait()
        except RuntimeError:            # a peer gone since the barrier: nothing to wait for
            return
        deadline = time.monotonic() + 5.0
        while [sys.getrefcount(t) for t in tensors] != held and time.monotonic() < deadline:
            time.sleep(1e-4)

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"trident.Context(rank={self.rank}, world_size={self.world_size}, "
                f"backend={self.backend!r}, device={self.device}, heap_size={self.heap_size}, "
                f"in_use={self.allocator.bytes_in_use})")

