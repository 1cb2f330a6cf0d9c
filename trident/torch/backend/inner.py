"""The inner group of a "trident" process group: a plain torch.distributed group over the
same ranks, made from the same store, that serves as the trident Context's host group
(its bootstrap, barriers and error exchanges) and as the fallback for what trident does
not do (trident/torch/backend/group.py).

It is gloo for CPU tensors and, on GPUs with one GPU per rank, NCCL for CUDA tensors
(gloo for them too where ranks share a GPU: NCCL refuses two ranks on one device). It is
made inside the backend's creator, before torch.distributed knows the outer group, with
torch's own group constructor (`_new_process_group_helper`, the same in torch 2.11 and
2.13) under a name of its own and a tag of its own, so that torch never takes it for the
user's group of the same ranks (functional collectives look groups up by ranks and tag).
The name sorts before every name torch gives ("+" < digits and hex), so that
`destroy_process_group()` shuts the outer group down first, while its context can still
close over this one.

NCCL is added for CUDA by hand (not through the constructor's device map): the
constructor would split it from the default group's communicator when that one is bound
to a device, a collective over the whole job that the ranks outside this group never
join.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ...runtime import _env, options


def inner_name(outer_name: str) -> str:
    """The inner group's name (and tag) for a trident group named `outer_name`."""
    return f"+trident:{outer_name}"


def nccl_usable(world_size: int) -> bool:
    """Whether the inner group can give CUDA tensors to NCCL: on GPUs, when this host's
    ranks (torchrun's LOCAL_WORLD_SIZE, else the group's size) do not outnumber the GPUs."""
    if _env.INTERPRET or not dist.is_nccl_available() or not torch.cuda.is_available():
        return False
    local = options.get("LOCAL_WORLD_SIZE", world_size)
    return local <= torch.cuda.device_count()


def make(store, rank: int, size: int, timeout, outer_name: str, global_ranks: list[int]):
    """Collective over the group's ranks: the inner group, registered with
    torch.distributed (so that dist.get_rank(inner), object collectives and torch's
    symmetric memory, which finds a group by name, all work on it).

    global_ranks: the members' ranks in the job ([] while the default group itself is
    being made, whose ranks are the job's)."""
    name = inner_name(outer_name)
    group_name = getattr(c10d, "GroupName", str)(name)
    pg, prefix_store = c10d._new_process_group_helper(
        size, rank, list(global_ranks), "gloo", store, group_name, timeout=timeout,
        pg_tag=name, group_desc="trident inner group")
    ranks = list(global_ranks) or list(range(size))
    c10d._world.pg_group_ranks[pg] = {g: r for r, g in enumerate(ranks)}
    if nccl_usable(size):
        _add_nccl(pg, prefix_store, rank, size, timeout, name, ranks)
    return pg


def _add_nccl(pg, prefix_store, rank, size, timeout, name, ranks) -> None:
    """Serve CUDA tensors of `pg` with NCCL (its own communicator, made at first use)."""
    from torch.distributed import ProcessGroupNCCL
    opts = ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = False
    opts._timeout = timeout
    opts.global_ranks_in_group = ranks
    opts.group_name = name
    nccl = ProcessGroupNCCL(c10d.PrefixStore("cuda-nccl/", prefix_store), rank, size, opts)
    nccl._set_sequence_number_for_group()
    pg._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL, nccl)
    c10d._world.pg_backend_config[pg] = "cpu:gloo,cuda:nccl"


def describe(pg) -> str:
    """'gloo' or 'cpu:gloo,cuda:nccl': what serves the inner group's tensors."""
    config = c10d._world.pg_backend_config.get(pg, "gloo")
    return "cpu:gloo,cuda:nccl" if "nccl" in config else "gloo"
