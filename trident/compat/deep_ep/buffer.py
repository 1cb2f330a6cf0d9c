"""DeepEP's Buffer (its intranode part) over a trident Context.

    buffer = deep_ep.Buffer(group, num_nvl_bytes, num_rdma_bytes, low_latency_mode=True,
                            num_qps_per_rank=num_experts // group.size())

The Buffer runs on the trident Context of `group`: `group` itself if it is a trident
Context, a "trident" process group's own (trident.torch.backend.context), else the open
Context of `group` in this process (trident.init or trident.launch made it), else one it
makes (collective) with a heap of num_nvl_bytes + num_rdma_bytes + 64 MiB, or trident's
default if that is larger, and closes in destroy(). num_nvl_bytes + num_rdma_bytes more
than the device's memory is a ValueError; after destroy() its calls raise RuntimeError("Buffer destroyed: ..."). What DeepEP offers
that trident cannot do the same raises NotImplementedError naming DeepEP's argument (see
docs/deep-ep.md).
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ...api.context import init
from ...runtime import _env, context as runtime_context, options
from .events import Config, EventHandle, EventOverlap, refuse
from .low_latency import LowLatencyMethods
from .normal import NormalMethods

_SLACK = 64 << 20            # heap bytes beyond the Buffer's for the context's own use
_OWNERS: dict = {}           # id(Context) -> Buffers that use a Context they made


def _backend_group(group):
    """The TridentProcessGroup behind `group` (backend "trident", also in a device map such
    as "cuda:trident,cpu:gloo"), or None."""
    from ...torch import backend as torch_backend
    if not torch_backend.registered():
        return None
    if isinstance(group, torch_backend.TridentProcessGroup):
        return group
    try:
        pg = group._get_backend(torch_backend.device())
    except (AttributeError, RuntimeError, ValueError):
        return None
    return pg if isinstance(pg, torch_backend.TridentProcessGroup) else None


def _group(group):
    """(the process group, its trident Context or None) of Buffer's first argument: a
    torch.distributed ProcessGroup (a "trident" one too) or a trident Context."""
    if isinstance(group, runtime_context.Context):
        if group._closed:
            raise ValueError("Buffer: the trident Context given is closed")
        return group.group, group
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"Buffer: group must be a torch.distributed ProcessGroup (e.g. "
                        f"dist.group.WORLD or dist.new_group(...)) or a trident Context, "
                        f"got {type(group).__name__} {group!r:.80}")
    return group, None


def _device_memory() -> int:
    """Bytes of memory where a new context would put its heap: the GPU's, the host's on
    the CPU emulation."""
    if not _env.INTERPRET and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _too_large(need: int, limit: int, of: str) -> ValueError:
    return ValueError(f"Buffer: num_nvl_bytes + num_rdma_bytes = {need} bytes per rank is "
                      f"more than {of} ({limit} bytes); trident sizes its buffers per call "
                      f"shape, so pass what the calls need (get_low_latency_rdma_size_hint, "
                      f"Config.get_nvl_buffer_size_hint)")


def _context(group, heap_bytes: int, given=None):
    """(ctx, made): `given` (a Context passed as the group), the Context of a "trident"
    process group (made now if new), or the open Context of `group` in this process, else
    a new one (None across nodes). Raises ValueError (on every rank alike: the same
    arguments) where heap_bytes is more than the device's memory. An existing context's
    smaller heap is not an error: heap_bytes is DeepEP's reservation, and trident sizes its
    buffers per call shape (a call that does not fit raises HeapFullError naming it)."""
    memory = _device_memory()
    if heap_bytes + _SLACK > memory:
        raise _too_large(heap_bytes, memory - _SLACK, "the device can hold (its memory, "
                         "less 64 MiB for the context)")
    pg = _backend_group(group) if given is None else None
    ctx = given if given is not None else pg.context() if pg is not None else next(
        (c for c in runtime_context.open_contexts()
         if getattr(c, "group", None) is group and not getattr(c, "_closed", False)), None)
    if ctx is not None:
        return ctx, False
    heap = max(options.get("TRIDENT_HEAP_SIZE"), heap_bytes + _SLACK)
    return init(heap_size=heap, group=group), True


def _config(nvl_send_tokens: dict, num_ranks: int) -> Config:
    """DeepEP's table entry of one node's rank count (NVLink send chunk per rank count)."""
    if num_ranks not in nvl_send_tokens:
        raise ValueError(f"Unsupported number of EP ranks: {num_ranks} (one node: 2, 4, 8)")
    return Config(Buffer.num_sms, nvl_send_tokens[num_ranks], 256, 6, 128)


class Buffer(LowLatencyMethods, NormalMethods):
    """DeepEP's deep_ep.Buffer for the ranks of one node: the low-latency calls
    (low_latency_dispatch / low_latency_combine, over trident.ExpertParallel) and the
    normal ones (get_dispatch_layout / dispatch / combine, over trident's all_to_all),
    with DeepEP's signatures, shapes, dtypes, layouts and return tuples. Attributes as
    DeepEP's (rank, group, group_size, num_nvl_bytes, num_rdma_bytes, low_latency_mode),
    and ctx, the trident Context it runs on.

    Every rank must make the same calls in the same order (as with DeepEP). Expert ids
    other than -1 outside [0, num_experts) are dropped and raised as a ValueError by the
    next ctx.sync() / ctx.barrier() in the low-latency mode, at the dispatch itself in
    the normal mode."""

    num_sms: int = 20

    def __init__(self, group, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0,
                 low_latency_mode: bool = False, num_qps_per_rank: int = 24,
                 allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False,
                 explicitly_destroy: bool = False, enable_shrink: bool = False,
                 comm=None) -> None:
        if comm is not None:
            refuse("comm (an mpi4py communicator)", "trident runs on a torch.distributed "
                   "group; pass group")
        if group is None:
            raise ValueError("Either 'group' or 'comm' must be provided.")
        group, given = _group(group)
        if allow_mnnvl:
            refuse("allow_mnnvl=True", "multi-node NVLink; trident.compat.deep_ep is one "
                   "node")
        if enable_shrink:
            refuse("enable_shrink=True", "rank masking (DeepEP's shrink mode)")
        if not allow_nvlink_for_low_latency_mode:
            refuse("allow_nvlink_for_low_latency_mode=False", "trident moves data over "
                   "NVLink only (no RDMA path)")
        for name, v in (("num_nvl_bytes", num_nvl_bytes), ("num_rdma_bytes", num_rdma_bytes),
                        ("num_qps_per_rank", num_qps_per_rank)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"Buffer: {name} must be a non-negative int, got {v!r}")
        if num_rdma_bytes and not low_latency_mode:
            refuse("num_rdma_bytes > 0 with low_latency_mode=False", "that is DeepEP's "
                   "internode (RDMA) normal mode; trident.compat.deep_ep is intranode")
        self.rank, self.group, self.group_size = group.rank(), group, group.size()
        self.num_nvl_bytes, self.num_rdma_bytes = num_nvl_bytes, num_rdma_bytes
        self.low_latency_mode = bool(low_latency_mode)
        self.explicitly_destroy, self.enable_shrink = explicitly_destroy, enable_shrink
        self.ctx, made = _context(group, num_nvl_bytes + num_rdma_bytes, given)
        if self.ctx is None or getattr(self.ctx, "spans_nodes", False):
            if made:
                self.ctx.close()
            self.ctx = None
            refuse("a group across nodes", "internode dispatch/combine; "
                   "trident.compat.deep_ep is intranode")
        if made or id(self.ctx) in _OWNERS:     # a context a Buffer made: closed by the last
            _OWNERS.setdefault(id(self.ctx), set()).add(id(self))
        self._cuda = self.ctx.backend == "cuda"
        self._ll: dict = {}           # (M, num_experts) -> [ExpertParallel x2, turn]
        self.ctx.register_reset(self)     # the turns (LowLatencyMethods.reset)
        self._zero_copy: dict = {}    # ExpertParallel -> zero_copy's combine buffer
        self._stage = None            # normal mode: the two heap buffers of all_to_all
        self._gather_bufs: dict = {}  # normal mode: the layout all_gather's buffers
        self._agreed: set = set()     # normal mode: what the ranks agreed on (_agree_once)
        self._last_agreed: dict = {}  # ... the last of each kind, described

    # ------------------------------------------------------------------ DeepEP's statics
    @staticmethod
    def is_sm90_compiled() -> bool:
        """True: trident's kernels are compiled at first use for the GPU present."""
        return True

    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        """DeepEP's SM count of the normal kernels (kept for Config; trident sizes grids
        itself)."""
        if new_num_sms % 2:
            raise ValueError("The SM count must be even")
        Buffer.num_sms = new_num_sms

    @staticmethod
    def capture() -> EventOverlap:
        """An EventOverlap recorded on the current stream."""
        return EventOverlap(EventHandle())

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int,
                                       num_ranks: int, num_experts: int) -> int:
        """Heap bytes the low-latency calls of this shape take (both ExpertParallel
        objects, BF16, up to 16 experts per token): pass it as num_rdma_bytes."""
        from ...moe import ExpertParallel
        return 2 * ExpertParallel.heap_bytes(num_ranks, min(num_experts, 16), hidden,
                                             num_max_dispatch_tokens_per_rank)

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        """DeepEP's recommended dispatch Config (no effect on trident's kernels)."""
        return _config({2: 24, 4: 6, 8: 6}, num_ranks)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        """DeepEP's recommended combine Config (no effect on trident's kernels)."""
        return _config({2: 10, 4: 9, 8: 4}, num_ranks)

    def get_comm_stream(self):
        refuse("get_comm_stream()", "trident runs every call on the caller's current "
               "stream; there is no communication stream")

    def get_local_buffer_tensor(self, dtype, size=None, offset: int = 0,
                                use_rdma_buffer: bool = False):
        refuse("get_local_buffer_tensor()", "trident's buffers are per call shape, not one "
               "raw buffer")

    def internode_dispatch(self, *args, **kwargs):
        refuse("internode_dispatch", "trident.compat.deep_ep is intranode")

    def internode_combine(self, *args, **kwargs):
        refuse("internode_combine", "trident.compat.deep_ep is intranode")

    # ------------------------------------------------------------------ lifetime
    def _destroyed(self, call: str) -> RuntimeError:
        """The error of a call after destroy() (the methods check `self.ctx is None`)."""
        return RuntimeError(f"Buffer destroyed: {call} was called after Buffer.destroy(); "
                            f"make a new deep_ep.Buffer")

    def destroy(self) -> None:
        """Free the heap memory of this Buffer (collective: every rank), and close the
        Context if this Buffer made it and no other Buffer uses it."""
        if self.ctx is None:
            return
        for pair in self._ll.values():
            for ep in pair[:2]:
                ep.close()
        self._ll.clear()
        self._zero_copy.clear()
        tensors = list(self._stage or ()) + [t for bufs in self._gather_bufs.values()
                                             for t in bufs]
        if tensors:
            self.ctx.barrier()
            for t in tensors:
                self.ctx.free(t)
        self._stage, self._gather_bufs = None, {}
        self._agreed, self._last_agreed = set(), {}
        users = _OWNERS.get(id(self.ctx))
        if users is not None:
            users.discard(id(self))
            if not users:
                del _OWNERS[id(self.ctx)]
                self.ctx.close()
        self.ctx = None

    def __repr__(self) -> str:
        return (f"trident.compat.deep_ep.Buffer(rank={self.rank}, group_size={self.group_size}"
                f", low_latency_mode={self.low_latency_mode})")


topk_idx_t = torch.int64
