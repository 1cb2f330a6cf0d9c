"""Topology: which ranks share a node (an NVLink domain, where the heap is mapped) and the
rails between nodes (the ranks of one local index on every node, which talk over the
network through torch.distributed).

Nodes are consecutive ranks, node_size of them each (rank r is local rank r % node_size
of node r // node_size), found in this order:
  1. TRIDENT_NODE_SIZE=n: nodes of n ranks, also on one host (how the multi-node path is
     tested on one machine);
  2. LOCAL_WORLD_SIZE (set by torchrun) when every rank has it;
  3. the host names: ranks on one host form a node.
Every rank must see the same layout, and the world must split into equal nodes of
consecutive ranks (torchrun assigns ranks that way); anything else is a ValueError.

`discover` makes the sub-groups once, on every rank in the same order (creating a group
is collective over the whole job): one per node (intra-node, trident's heap and kernels)
and one per rail (inter-node steps). With one node it makes none.
"""
from __future__ import annotations

import datetime
import socket

import torch
import torch.distributed as dist

from ..runtime import _env, options, placement
from ..runtime.context_exchange import forget_failed

NODE_SIZE_ENV = "TRIDENT_NODE_SIZE"


def node_size_from_env(world_size: int) -> int | None:
    """TRIDENT_NODE_SIZE checked against `world_size`, or None when it is not set."""
    n = options.get(NODE_SIZE_ENV)
    if n is None:
        return None
    if world_size % n:
        raise ValueError(f"{NODE_SIZE_ENV}={n} does not split {world_size} ranks into equal "
                         f"nodes: it must be a positive divisor of the world size")
    return n


class Topology:
    """The layout of a context's ranks: `num_nodes` nodes of `node_size` consecutive ranks.

    Attributes: world_size, rank, node_size, num_nodes, node (this rank's node index),
    local_rank (its index inside the node), source (how the nodes were found),
    node_group and rail_group (this rank's torch.distributed sub-groups; None with one
    node, where the context's own group is the node), and rail_barrier_group (the same
    ranks as rail_group, for barriers only: a barrier of one node can then never be taken
    for a data step of another that skipped or added a call)."""

    def __init__(self, world_size: int, rank: int, node_size: int, source: str,
                 node_group=None, rail_group=None):
        if node_size < 1 or world_size % node_size:
            raise ValueError(f"{world_size} ranks do not split into nodes of {node_size}")
        self.world_size, self.rank, self.node_size, self.source = world_size, rank, node_size, source
        self.num_nodes = world_size // node_size
        self.node, self.local_rank = divmod(rank, node_size)
        self.node_group, self.rail_group = node_group, rail_group
        self.rail_barrier_group = None

    @property
    def spans_nodes(self) -> bool:
        return self.num_nodes > 1

    def node_of(self, rank: int) -> int:
        return rank // self.node_size

    def node_ranks(self, node: int | None = None) -> list[int]:
        """The ranks of node `node` (default: this rank's), in local-rank order."""
        node = self.node if node is None else node
        return list(range(node * self.node_size, (node + 1) * self.node_size))

    def rail_ranks(self, local_rank: int | None = None) -> list[int]:
        """The ranks of local index `local_rank` (default: this rank's) on every node, in
        node order: rank i of the rail group is on node i."""
        local = self.local_rank if local_rank is None else local_rank
        return list(range(local, self.world_size, self.node_size))

    def describe(self) -> str:
        """The layout in one paragraph (for `trident info` and logs)."""
        return layout(self.world_size, self.node_size, self.source)

    def __repr__(self) -> str:
        return (f"Topology(world_size={self.world_size}, node_size={self.node_size}, "
                f"num_nodes={self.num_nodes}, rank={self.rank}, node={self.node}, "
                f"local_rank={self.local_rank}, source={self.source!r})")


def layout(world_size: int, node_size: int, source: str) -> str:
    """Nodes and rails of `world_size` ranks in nodes of `node_size`, spelled out."""
    num_nodes = world_size // node_size
    nodes = "; ".join(f"node {k}: ranks {list(range(k * node_size, (k + 1) * node_size))}"
                      for k in range(num_nodes))
    rails = "; ".join(f"rail {l}: ranks {list(range(l, world_size, node_size))}"
                      for l in range(node_size))
    return (f"{num_nodes} node(s) of {node_size} rank(s) ({source}). {nodes}. Rails (one "
            f"rank per node, the inter-node steps): {rails}")


def _bind_device() -> None:
    """Put this process on its GPU before the first collective of a NCCL group (the rule
    trident.Context uses: LOCAL_RANK, else the global rank, round-robin over the GPUs)."""
    if not _env.INTERPRET and torch.cuda.is_available():
        rank = options.get("LOCAL_RANK", dist.get_rank())
        torch.cuda.set_device(placement.device_index(rank, torch.cuda.device_count()))


def _nodes(everyone: list[tuple], ranks: list[int]) -> tuple[list, str]:
    """(each member's node, source) from every member's (host, LOCAL_WORLD_SIZE,
    TRIDENT_NODE_SIZE); `ranks`: the members' ranks in the whole job (the env sizes count
    those)."""
    world_size = dist.get_world_size()
    for i, what in ((2, NODE_SIZE_ENV), (1, "LOCAL_WORLD_SIZE")):
        values = {e[i] for e in everyone}
        if values == {""}:
            continue
        if len(values) > 1:
            raise ValueError(f"the ranks disagree on {what}: {[e[i] for e in everyone]} (rank "
                             f"order); every rank must see the same value")
        if i == 2:
            n = node_size_from_env(world_size)
        else:
            n = int(values.pop())
            if n < 1 or world_size % n:
                raise ValueError(f"LOCAL_WORLD_SIZE={n} does not divide the world size "
                                 f"{world_size}")
        return [r // n for r in ranks], f"{what}={n}"
    return [e[0] for e in everyone], "host names"


def _node_size(nodes: list, source: str) -> int:
    """The size of the nodes, checked to be equal blocks of consecutive ranks."""
    runs = [h for i, h in enumerate(nodes) if i == 0 or nodes[i - 1] != h]
    n = nodes.count(nodes[0])
    if len(runs) != len(set(runs)) or any(nodes.count(h) != n for h in runs):
        raise ValueError(f"the ranks' nodes {nodes} (rank order, from {source}) do not form "
                         f"equal blocks of consecutive ranks; start n ranks per host with "
                         f"consecutive ranks (torchrun does) or set {NODE_SIZE_ENV}")
    return n


def find_nodes(group) -> tuple[list, str]:
    """Collective over `group` (of more than one rank): each member's node, in group rank
    order, and how the nodes were found (the rules of the module docstring). Makes no
    group."""
    mine = (socket.gethostname(), str(options.get("LOCAL_WORLD_SIZE", "")),
            str(options.get(NODE_SIZE_ENV, "")))
    world_size = dist.get_world_size(group)
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine, group=group)
    ranks = [dist.get_global_rank(group, r) for r in range(world_size)]
    return _nodes(everyone, ranks)


def discover(group=None, timeout_s: float | None = None) -> Topology:
    """Collective over `group` (default: the whole job): find the nodes, make the node and
    rail groups when there are several. A group that spans nodes must be the whole job
    (its sub-groups are made by every rank of the job). timeout_s: the sub-groups' limit
    on one collective (the context's host timeout; None: torch.distributed's default), so
    that a node that skips a call makes the others fail in time instead of hanging."""
    group = dist.group.WORLD if group is None else group
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    if world_size == 1:
        if group is dist.group.WORLD:
            node_size_from_env(1)                # a TRIDENT_NODE_SIZE other than 1 is wrong
        return Topology(1, 0, 1, "one rank")
    _bind_device()
    nodes, source = find_nodes(group)
    if len(set(nodes)) == 1:
        return Topology(world_size, rank, world_size, source)
    if world_size != dist.get_world_size():
        raise ValueError(f"a context over a group that spans nodes must use the whole job's "
                         f"group ({dist.get_world_size()} ranks), got a group of {world_size} "
                         f"on nodes {nodes}; for a node-local context pass a group of one "
                         f"node's ranks")
    node_size = _node_size(nodes, source)
    topo = Topology(world_size, rank, node_size, source)
    limit = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    for k in range(topo.num_nodes):          # same order on every rank
        g = dist.new_group(topo.node_ranks(k), **limit)
        if k == topo.node:
            topo.node_group = g
    for l in range(node_size):
        data, barrier = (dist.new_group(topo.rail_ranks(l), **limit) for _ in range(2))
        if l == topo.local_rank:
            topo.rail_group, topo.rail_barrier_group = data, barrier
    for g in (topo.node_group, topo.rail_group, topo.rail_barrier_group):
        _GROUP_TIMEOUT_S[g] = timeout_s
    return topo


_GROUP_TIMEOUT_S: dict = {}     # the sub-groups' limit, set once when they are made


def group_timeout_s(group, default: float) -> float:
    """The limit `discover` gave `group` (fixed when it was made: a later
    ctx.set_timeout does not change it), else `default`."""
    limit = _GROUP_TIMEOUT_S.get(group)
    return default if limit is None else limit


def forget_groups(*groups) -> None:
    """Drop what is recorded of groups about to be destroyed (their limit here, and
    whether they failed: trident/runtime/context_exchange.py)."""
    for g in groups:
        _GROUP_TIMEOUT_S.pop(g, None)
    forget_failed(*groups)


def pool_in_nodes(world_size: int, node_size: int, **pool_options):
    """A trident.runtime.launch.RankPool of world_size ranks in nodes of node_size consecutive
    ranks (TRIDENT_NODE_SIZE in the ranks' environment only; this process's own is left
    as it was): how the tests and benchmarks start a world of nodes on one machine."""
    from ..runtime.launch import RankPool
    with options.exported({NODE_SIZE_ENV: node_size}):
        return RankPool(world_size, **pool_options)
