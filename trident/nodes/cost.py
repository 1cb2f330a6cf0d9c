"""Cost model of a collective across nodes, until measured tables exist: the hierarchical
algorithm (trident inside each node, torch.distributed on the rails) against "nccl"
(one torch.distributed collective over the whole world).

Each path costs  hops * latency + bytes / bandwidth  per link kind, for one rank, with
N the op's bytes per rank (as in selector.py), W ranks in M nodes of L:

  op              flat (nccl, network)          hierarchical: node step(s) + rail step
  all_reduce      2log2(W) hops, 2(W-1)/W N     2 steps, 2(L-1)/L N  +  2log2(M) hops, 2(M-1)/M N/L
  all_gather      W-1 hops, (W-1) N             1 step, (L-1) M N    +  M-1 hops, (M-1) N
  reduce_scatter  W-1 hops, (W-1) N             1 step, (L-1) M N    +  M-1 hops, (M-1) N
  all_to_all      W-1 hops, (W-L)/W N           1 step, (L-1)/L N    +  M-1 hops, (M-1)/M N
  broadcast       log2(W) hops, N               1 step, N            +  log2(M) hops, N

(log2 rounded up; the flat collective's bytes are those that cross the network, which
paces a ring that spans nodes.) The hierarchical path sends L times fewer network bytes
for the reductions and gathers, and fewer network messages for all of them; it pays one
or two node steps. Parameters: the network per GPU, TRIDENT_INTERNODE_GBPS (default 50
GB/s: a 400 Gb/s NIC per GPU) and TRIDENT_INTERNODE_US (default 10 us per hop), and the
node's links, NVLink 370 GB/s usable per GPU one way and 10 us per trident step (an eager
launch with its host work; docs/design.md, "How to make it fast").
"""
from __future__ import annotations

import math

from ..runtime import options

INTRA_GBPS, INTRA_US = 370.0, 10.0
INTER_GBPS_ENV, INTER_US_ENV = "TRIDENT_INTERNODE_GBPS", "TRIDENT_INTERNODE_US"


def internode(opts=None) -> tuple[float, float]:
    """(GB/s, us per hop) of the network between nodes: from a context's options (`opts`,
    ctx.options), else from the environment now."""
    if opts is not None:
        return opts.internode_gbps, opts.internode_us
    return options.get(INTER_GBPS_ENV), options.get(INTER_US_ENV)


def _log2(n: int) -> int:
    return max(1, math.ceil(math.log2(n))) if n > 1 else 0


def _link(hops: float, nbytes: float, us: float, gbps: float) -> float:
    return hops * us + nbytes / (gbps * 1e3)          # GB/s = 1e3 bytes per us


def predict(op: str, nbytes: int, nodes: int, node_size: int,
            inter: tuple[float, float] | None = None,
            intra: tuple[float, float] = (INTRA_GBPS, INTRA_US)) -> dict[str, float]:
    """Predicted microseconds of {"hierarchical": ..., "nccl": ...} for `op` at `nbytes`
    per rank on `nodes` nodes of `node_size` ranks; inter = (GB/s, us) of the network
    (default: internode()), intra = (GB/s, us per step) inside a node."""
    gbps, us = inter or internode()
    node_gbps, node_us = intra
    m, l, n = nodes, node_size, float(nbytes)
    w = m * l
    if op == "all_reduce":
        flat = _link(2 * _log2(w), 2 * (w - 1) / w * n, us, gbps)
        node = _link(2, 2 * (l - 1) / l * n, node_us, node_gbps)
        rail = _link(2 * _log2(m), 2 * (m - 1) / m * n / l, us, gbps)
    elif op in ("all_gather", "reduce_scatter"):
        flat = _link(w - 1, (w - 1) * n, us, gbps)
        node = _link(1, (l - 1) * m * n, node_us, node_gbps)
        rail = _link(m - 1, (m - 1) * n, us, gbps)
    elif op == "all_to_all":
        flat = _link(w - 1, (w - l) / w * n, us, gbps)
        node = _link(1, (l - 1) / l * n, node_us, node_gbps)
        rail = _link(m - 1, (m - 1) / m * n, us, gbps)
    elif op == "broadcast":
        flat = _link(_log2(w), n, us, gbps)
        node = _link(1, n, node_us, node_gbps)
        rail = _link(_log2(m), n, us, gbps)
    else:
        raise ValueError(f"no cost model for {op!r}")
    return {"hierarchical": node + rail, "nccl": flat}


def select(op: str, nbytes: int, nodes: int, node_size: int, nccl: bool = True,
           inter: tuple[float, float] | None = None) -> str:
    """"auto" across nodes: "hierarchical" or "nccl" (one torch.distributed collective
    over the world) by the model below until measured tables exist; nccl=False (GPU ranks
    sharing a GPU, where the flat path cannot run) always gives "hierarchical". inter: as
    for predict (a context passes internode(ctx.options): no call reads the environment)."""
    return choose(op, nbytes, nodes, node_size, inter) if nccl else "hierarchical"


def choose(op: str, nbytes: int, nodes: int, node_size: int,
           inter: tuple[float, float] | None = None) -> str:
    """The algorithm the model predicts faster (ties: hierarchical)."""
    t = predict(op, nbytes, nodes, node_size, inter)
    return "hierarchical" if t["hierarchical"] <= t["nccl"] else "nccl"
