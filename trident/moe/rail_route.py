"""The network stage of MoE across nodes: tokens packed per destination node into
fixed-capacity rows, sent once over the rail (trident/ccl/hierarchical/rail.py), and the
combined rows summed back into the sender's tokens (trident/moe/across_nodes.py).

A rail row is one token for one destination node, as bytes:

    [ payload | ids (K int32) | weights (K fp32) ]      (each part 16-byte aligned)

payload: the token in the ExpertParallel's dtype, or (fp8) its e4m3 bytes followed by its
H/128 fp32 scales (trident/moe/fp8.py: half the bytes of bf16). ids: the token's experts
on the destination node as node-local ids, -1 for experts elsewhere, dropped ones and
unused rows; weights: the top-k weights when dispatch was given them. Node k's block
holds cap = max_num_tokens rows (a token goes at most once to each node); a row is in use
iff one of its ids is >= 0, so the counts travel inside the payload and every size the
network step sees is fixed on the host: no host synchronisation, capturable.

The packing is torch on the device (cumsum positions: the rows of a block keep token
order); the expert ids are first checked by `clean_ids_kernel`, the same device-side
check as one node's dispatch (routing.py), which records the first bad id for
ctx.sync()/ctx.barrier() to raise.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import fp8 as F8
from .routing import expert_ids


@triton.jit
def clean_ids_kernel(topk_idx, stride_it, stride_ik, out, num_tokens, num_experts, ctrl,
                     check, K: tl.constexpr, KP: tl.constexpr):
    """out[t, :K] (int32) = token t's expert ids, -1 where dropped (routing.expert_ids)."""
    ks = tl.arange(0, KP)
    for t in range(tl.program_id(0), num_tokens, tl.num_programs(0)):
        e = expert_ids(topk_idx, t, stride_it, stride_ik, num_experts, ctrl, check, K, KP)
        tl.store(out + t * K + ks, e, mask=ks < K)


def _align(n: int) -> int:
    return (n + 15) // 16 * 16


class RailRows:
    """The rail buffers of one ExpertParallel across nodes (plain device memory, not the
    heap: NCCL reads and writes them). `send`/`recv`: bytes of num_nodes * cap rows (send
    has one more, a trash row that tokens not bound for a node are written to); `back`:
    combine's rows returned from each node, [num_nodes * cap + 1, H] in the dtype, its
    last row zero (what a token not sent to a node gathers)."""

    def __init__(self, num_nodes: int, cap: int, hidden: int, k: int, dtype: torch.dtype,
                 device):
        self.nodes, self.cap, self.hidden, self.k, self.dtype = num_nodes, cap, hidden, k, dtype
        self.esize = torch.empty((), dtype=dtype).element_size()
        self.rows = num_nodes * cap
        fp8_bytes = hidden + hidden // F8.GROUP_SIZE * 4 if hidden % F8.GROUP_SIZE == 0 else 0
        self.row_bytes = {False: _align(hidden * self.esize) + _align(8 * k),
                          True: _align(fp8_bytes) + _align(8 * k)}
        self.payload_bytes = {False: _align(hidden * self.esize), True: _align(fp8_bytes)}
        biggest = max(self.row_bytes.values())
        self.send = torch.empty((self.rows + 1) * biggest, dtype=torch.uint8, device=device)
        self.recv = torch.empty(self.rows * biggest, dtype=torch.uint8, device=device)
        self.back = torch.zeros(self.rows + 1, hidden, dtype=dtype, device=device)
        self.clean = torch.empty(cap, k, dtype=torch.int32, device=device)
        self.dest = torch.empty(cap, num_nodes, dtype=torch.int64, device=device)
        self.nodes_ar = torch.arange(num_nodes, device=device)
        self.weights_send = torch.empty(self.rows + 1, k, dtype=torch.float32, device=device)
        self.weights_recv = torch.empty(self.rows, k, dtype=torch.float32, device=device)

    def views(self, raw: torch.Tensor, n: int, fp8: bool) -> dict:
        """The parts of the first n rows of `raw` (send or recv) in the layout of `fp8`."""
        R, P, H, k = self.row_bytes[fp8], self.payload_bytes[fp8], self.hidden, self.k
        rows = raw[:n * R].view(n, R)
        parts = dict(rows=rows, ids=rows[:, P:P + 4 * k].view(torch.int32),
                     weights=rows[:, P + 4 * k:P + 8 * k].view(torch.float32))
        if fp8:
            parts["q"] = rows[:, :H]
            parts["scale"] = rows[:, H:H + H // F8.GROUP_SIZE * 4].view(torch.float32)
        else:
            parts["x"] = rows[:, :H * self.esize].view(self.dtype)
        return parts


def pack(r: RailRows, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor | None,
         experts_per_node: int, fp8: bool) -> dict:
    """Write tokens x [T, H] with clean ids [T, K] (and weights) into r.send's rows, one
    row per (token, node it has experts on), in token order within a node's block; keeps
    each (token, node)'s row in r.dest[:T] (r.rows where not sent). Returns send's views."""
    T, M, cap = x.shape[0], r.nodes, r.cap
    send = r.views(r.send, r.rows + 1, fp8)
    send["ids"].fill_(-1)
    node = torch.where(ids >= 0, ids // experts_per_node, -1)              # [T, K]
    on = node[:, None, :] == r.nodes_ar[None, :, None]                     # [T, M, K]
    to = on.any(dim=2)                                                     # [T, M]
    dest = torch.where(to, r.nodes_ar * cap + to.cumsum(dim=0) - 1, r.rows)
    r.dest[:T].copy_(dest)
    dest = r.dest[:T]
    local = ids[:, None, :] - (r.nodes_ar * experts_per_node)[None, :, None]
    send["ids"].index_put_((dest,), torch.where(on, local, -1).to(torch.int32))
    if w is not None:
        send["weights"].index_put_((dest,), w[:, None, :].expand(T, M, r.k))
    if fp8:
        q, scale = F8.quantize(x)
        send["q"].index_put_((dest,), q.view(torch.uint8)[:, None, :].expand(T, M, r.hidden))
        send["scale"].index_put_((dest,), scale[:, None, :].expand(T, M, scale.shape[1]))
    else:
        send["x"].index_put_((dest,), x[:, None, :].expand(T, M, r.hidden))
    return send


def pack_weights(r: RailRows, w: torch.Tensor) -> torch.Tensor:
    """Combine-time top-k weights [T, K] into the rows their tokens took (r.dest)."""
    T = w.shape[0]
    r.weights_send.index_put_((r.dest[:T],), w[:, None, :].expand(T, r.nodes, r.k))
    return r.weights_send[:r.rows]


def unpack(r: RailRows, out: torch.Tensor) -> torch.Tensor:
    """out [T, H] = sum over nodes of the rows r.back returned for each token (fp32
    accumulation, node order; the zero row for a node the token was not sent to)."""
    T = out.shape[0]
    rows = r.back.index_select(0, r.dest[:T].reshape(-1)).view(T, r.nodes, r.hidden)
    return out.copy_(rows.float().sum(dim=1))
