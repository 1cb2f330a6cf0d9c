"""torch.distributed backend "trident": torch's own collectives, run by trident.

`import trident` registers it; then the one line a program changes is

    dist.init_process_group("trident")          # or "cuda:trident,cpu:gloo"

(or `dist.new_group(ranks, backend="trident")`), and torch.distributed's collectives on
that group -- including those DTensor, tensor parallel and FSDP2 make -- run as trident
kernels on the symmetric heap, with NCCL's semantics. What trident does not do goes to an
inner NCCL/gloo group over the same ranks. What goes where: trident/torch/backend/group.py
and docs/torch-backend.md.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ...runtime import _env, launch as _launch
from .group import FALLBACK_OPS, TRIDENT_OPS, Options, TridentProcessGroup, create

NAME = "trident"
DEVICES = ["cuda", "cpu"]


def register() -> bool:
    """Register backend "trident" with torch.distributed (idempotent); True once it is."""
    if not dist.is_available():
        return False
    if NAME.upper() in dist.Backend._plugins:
        return True
    dist.Backend.register_backend(NAME, create, extended_api=True, devices=DEVICES)
    return True


def registered() -> bool:
    """Whether torch.distributed knows backend "trident"."""
    return dist.is_available() and NAME.upper() in dist.Backend._plugins


def group_of(group=None) -> TridentProcessGroup:
    """`group` (default: the default group) as a trident process group, or TypeError."""
    pg = group if group is not None else dist.group.WORLD
    if not isinstance(pg, TridentProcessGroup):
        raise TypeError(f"not a process group of backend 'trident': {pg!r}; make one with "
                        f"dist.init_process_group('trident') or dist.new_group(..., "
                        f"backend='trident')")
    return pg


def context(group=None):
    """The trident Context of a "trident" process group (default: the default group),
    made now if this is the group's first use: collective over the group. Allocate
    tensors with it (ctx.empty(...)) to have collectives use them without a copy. None
    where the group has none (its ranks span nodes: see its context_error)."""
    return group_of(group).context()


def device() -> torch.device:
    """The device of the tensors trident serves in this process: this rank's GPU ("cuda"
    and the current device), or "cpu" on the CPU emulation (whose tensors are CPU
    tensors). A DeviceMesh over a trident group takes its type."""
    if _env.INTERPRET:
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def describe() -> str:
    """A paragraph for `trident info`: registered or not, what goes where."""
    if not registered():
        return "torch.distributed backend 'trident': not registered"
    return (f"torch.distributed backend 'trident': registered (dist.init_process_group("
            f"'trident'), devices {DEVICES}). To trident: {', '.join(TRIDENT_OPS)} (reductions "
            f"SUM/MAX/MIN on bf16/fp16/fp32 and int8/uint8/int32/int64, AVG on the floats; moving "
            f"ops any dtype). Falls back to the inner "
            f"group (NCCL for CUDA tensors with one GPU per rank, else gloo): "
            f"{', '.join(FALLBACK_OPS)}, other reductions and dtypes, tensors of another "
            f"device, and groups that span nodes")


def _rank_context(heap_size, timeout):
    """The context of a rank started by trident.launch(..., dist_backend="trident")."""
    return context()


def _rank_options(heap_size, timeout) -> Options:
    return Options(heap_size=heap_size, timeout=timeout)


_launch.register_rank_init(NAME, _rank_context, _rank_options)

__all__ = ["register", "registered", "context", "group_of", "device", "describe", "Options",
           "TridentProcessGroup", "NAME"]
