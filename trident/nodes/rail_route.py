"""The network stage of MoE across nodes: tokens packed per destination node into
fixed-capacity rows, sent once over the rail (trident/nodes/rail.py), and the
combined rows summed back into the sender's tokens (trident/nodes/expert_parallel.py).

A rail row is one token for one destination node, as bytes:

    [ payload | ids (K int32) | weights (K fp32) ]      (each part 16-byte aligned)

payload: the token in the ExpertParallel's dtype, or (fp8) its e4m3 bytes followed by its
H/128 fp32 scales (trident/moe/fp8.py: half the bytes of bf16). ids: the token's experts
on the destination node as node-local ids, -1 for experts elsewhere, dropped ones and
unused rows; weights: the top-k weights when dispatch was given them. Node k's block
holds cap = max_num_tokens rows (a token goes at most once to each node); a row is in use
iff one of its ids is >= 0, so the counts travel inside the payload and every size the
network step sees is fixed on the host: no host synchronisation, capturable.

`pack_kernel` packs a dispatch in one launch: it checks the expert ids with the same
device-side check as one node's dispatch (routing.py, which records the first bad id for
ctx.sync()/ctx.barrier() to raise), takes each row's position in its node's block from an
atomic counter (so the rows of a block are in arrival order, not token order: dest
records where each token went), and for fp8 quantises each token once (fp8.py); its
last program marks the rows no token took and zeroes the counters. On the way back,
`unpack_kernel` sums each token's rows from the nodes (one launch), and at the forwarding
rank `dequantize_kernel` turns fp8 rows into the dtype (one launch, rows in use only).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime.plans import Live, Plan
from ..moe import fp8 as F8
from ..moe.routing import expert_ids


@triton.jit
def pack_kernel(x, stride_x, topk_idx, stride_it, stride_ik, topk_w, stride_wt, stride_wk,
                send_x, send_q, send_s, send_ids, send_w, stride_row, stride_row4,
                dest, counter, done, ctrl, check, num_tokens, num_experts, experts_per_node,
                num_nodes, cap, trash, H: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
                MP: tl.constexpr, HAS_WEIGHTS: tl.constexpr, FP8: tl.constexpr,
                BLOCK_H: tl.constexpr, FILL_ROWS: tl.constexpr):
    """One launch packs every token: its ids checked (routing.expert_ids, the one-node
    check), then once per node holding any of its experts a row of that node's block at
    the next free position (counter[node], atomic: positions in arrival order), holding
    the token (fp8: e4m3 words and scales, quantised once), its node-local ids and its
    weights; dest[t, node] = the row, `trash` where not sent. The last program to finish
    marks the rows no token took as unused and zeroes the counters (_finish). Row
    strides: stride_row in elements of the dtype (send_x), stride_row4 in 4-byte words
    (the other views)."""
    ks = tl.arange(0, KP)
    ms = tl.arange(0, MP)
    for t in range(tl.program_id(0), num_tokens, tl.num_programs(0)):
        e = expert_ids(topk_idx, t, stride_it, stride_ik, num_experts, ctrl, check, K, KP)
        node = tl.where(e >= 0, e // experts_per_node, -1)
        on = node[None, :] == ms[:, None]                                   # [MP, KP]
        hit = (tl.max(on.to(tl.int32), axis=1) > 0) & (ms < num_nodes)
        pos = tl.atomic_add(counter + ms, 1, mask=hit, sem="relaxed", scope="gpu")
        row = tl.where(hit, ms.to(tl.int64) * cap + pos, trash)
        tl.store(dest + t * num_nodes + ms, row, mask=ms < num_nodes)
        local = tl.where(on, e[None, :] - ms[:, None] * experts_per_node, -1)
        kmask = hit[:, None] & (ks[None, :] < K)
        tl.store(send_ids + row[:, None] * stride_row4 + ks[None, :], local, mask=kmask)
        if HAS_WEIGHTS:
            w = tl.load(topk_w + t * stride_wt + ks * stride_wk, mask=ks < K, other=0.0)
            tl.store(send_w + row[:, None] * stride_row4 + ks[None, :],
                     tl.broadcast_to(w[None, :], [MP, KP]), mask=kmask)
        src = x + t * stride_x
        if FP8:     # as dispatch's push_payload: 2 * BLOCK_H channels per step
            G: tl.constexpr = 2 * BLOCK_H // F8.GROUP
            GW: tl.constexpr = F8.GROUP // 4
            groups = tl.arange(0, G)
            chan = tl.arange(0, F8.GROUP)
            wcols = tl.arange(0, GW)
            for c in tl.static_range(0, H, 2 * BLOCK_H):
                gm = c // F8.GROUP + groups < H // F8.GROUP
                v = tl.load(src + c + groups[:, None] * F8.GROUP + chan[None, :],
                            mask=gm[:, None], other=0.0)
                words, scale = F8.quantize_groups(v.to(tl.float32), G)
                for m in range(0, num_nodes):
                    r = tl.sum(tl.where(ms == m, row, 0))
                    keep = r != trash
                    tl.store(send_q + r * stride_row4 + c // 4 + groups[:, None] * GW
                             + wcols[None, :], words, mask=gm[:, None] & keep)
                    tl.store(send_s + r * stride_row4 + c // F8.GROUP + groups, scale,
                             mask=gm & keep)
        else:
            cols = tl.arange(0, BLOCK_H)
            for c in tl.static_range(0, H, BLOCK_H):
                cm = c + cols < H
                v = tl.load(src + c + cols, mask=cm)
                tl.store(send_x + row[:, None] * stride_row + c + cols[None, :],
                         tl.broadcast_to(v[None, :], [MP, BLOCK_H]),
                         mask=hit[:, None] & cm[None, :])
    _finish(send_ids, stride_row4, counter, done, num_nodes, cap, K, KP, FILL_ROWS)


@triton.jit
def _finish(send_ids, stride_row4, counter, done, num_nodes, cap, K: tl.constexpr,
            KP: tl.constexpr, FILL_ROWS: tl.constexpr):
    """The last program of pack_kernel to arrive (a ticket on `done`, acq_rel: it sees
    every other program's counter increments) takes each node's count, zeroing the
    counter for the next call, and writes ids -1 into that block's rows past the count,
    so that the receiver skips them; then it zeroes `done`. This saves two memsets per
    dispatch and keeps the call one launch."""
    tl.debug_barrier()              # every thread of this program has made its stores
    ticket = tl.atomic_add(done, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(0) - 1:
        ks = tl.arange(0, KP)
        rs = tl.arange(0, FILL_ROWS)
        unused = tl.full([FILL_ROWS, KP], -1, tl.int32)
        for m in range(0, num_nodes):
            used = tl.atomic_xchg(counter + m, 0, sem="relaxed", scope="gpu")
            for r0 in range(used, cap, FILL_ROWS):
                rows = m * cap + r0 + rs
                tl.store(send_ids + rows.to(tl.int64)[:, None] * stride_row4 + ks[None, :],
                         unused, mask=(r0 + rs < cap)[:, None] & (ks < K)[None, :])
        tl.atomic_xchg(done, 0, sem="relaxed", scope="gpu")


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
        self.counter = torch.zeros(num_nodes, dtype=torch.int32, device=device)
        self.done = torch.zeros(1, dtype=torch.int32, device=device)    # pack's tickets
        self.dest = torch.empty(cap, num_nodes, dtype=torch.int64, device=device)
        self.weights_send = torch.empty(self.rows + 1, k, dtype=torch.float32, device=device)
        self.weights_recv = torch.empty(self.rows, k, dtype=torch.float32, device=device)
        self._views: dict = {}

    def reset(self) -> None:
        """After ctx.reset(): counters as at the start (a pack that failed midway could
        leave them non-zero)."""
        self.counter.zero_()
        self.done.zero_()

    def views(self, raw: torch.Tensor, n: int, fp8: bool) -> dict:
        """The parts of the first n rows of `raw` (send or recv) in the layout of `fp8`
        (made once: the buffers are fixed)."""
        key = (raw is self.send, n, fp8)
        parts = self._views.get(key)
        if parts is None:
            parts = self._views[key] = self._make_views(raw, n, fp8)
        return parts

    def _make_views(self, raw: torch.Tensor, n: int, fp8: bool) -> dict:
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


def pack_plan(r: RailRows, node, x: torch.Tensor, topk_idx: torch.Tensor, w, check: bool,
              num_experts: int, experts_per_node: int, fp8: bool, block_h: int,
              kp: int) -> Plan:
    """The launch plan (trident/runtime/plans.py) that writes tokens x [T, H] (ids topk_idx,
    weights w or None) into r.send's rows, one row per (token, node it has experts on),
    and each (token, node)'s row into r.dest[:T] (r.rows where not sent); the rows no
    token took get ids -1. One launch (pack_kernel), also for T = 0. Bad ids are
    recorded in `node`'s control block when `check`. The call's tensors are kept as
    addresses only (the plan's key holds them)."""
    T = x.shape[0]
    plan = Plan((x, topk_idx, w), "moe_pack")
    send = r.views(r.send, r.rows + 1, fp8)
    words = send["rows"][:, :4].view(torch.int32)      # any 4-byte view: the row base
    q = send["q"].view(torch.int32) if fp8 else words
    sx = send["x"] if not fp8 else x
    if not T:                  # nothing is read: stand-ins with an address
        x, topk_idx, sx = words, words, (send["x"] if not fp8 else words)
    plan.launch(
        pack_kernel, (grid_programs(node, T),),
        x, x.stride(0), topk_idx, topk_idx.stride(0), topk_idx.stride(1),
        x if w is None else w, 0 if w is None else w.stride(0), 0 if w is None else w.stride(1),
        sx, q, send["scale"] if fp8 else words, send["ids"], send["weights"],
        send["x"].stride(0) if not fp8 else 0, send["ids"].stride(0),
        r.dest, r.counter, r.done, node.ctrl, int(check), T, num_experts, experts_per_node,
        r.nodes, r.cap, r.rows, H=r.hidden, K=r.k, KP=kp,
        MP=max(2, triton.next_power_of_2(r.nodes)), HAS_WEIGHTS=w is not None, FP8=fp8,
        BLOCK_H=block_h, FILL_ROWS=64, num_warps=_warps(node))
    return plan


def _warps(node) -> int:
    return 4 if node.backend == "cuda" else 1


def grid_programs(node, n: int) -> int:
    """Programs of a grid-stride launch over n items: two per usable SM on GPUs, 2 on
    the CPU emulation."""
    return max(1, min(n, 2 * node.usable_sms if node.backend == "cuda" else 2))


def pack_weights(r: RailRows, w: torch.Tensor) -> torch.Tensor:
    """Combine-time top-k weights [T, K] into the rows their tokens took (r.dest)."""
    T = w.shape[0]
    r.weights_send.index_put_((r.dest[:T],), w[:, None, :].expand(T, r.nodes, r.k))
    return r.weights_send[:r.rows]


@triton.jit
def unpack_kernel(back, stride_back, dest, out, stride_out, num_tokens, num_nodes, trash,
                  H: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t] = sum over nodes m of back[dest[t, m]] in fp32, in node order; a node the
    token was not sent to (dest == trash) adds nothing."""
    cols = tl.arange(0, BLOCK_H)
    for t in range(tl.program_id(0), num_tokens, tl.num_programs(0)):
        for c in tl.static_range(0, H, BLOCK_H):
            cm = c + cols < H
            acc = tl.zeros([BLOCK_H], tl.float32)
            for m in range(0, num_nodes):
                row = tl.load(dest + t * num_nodes + m)
                acc += tl.load(back + row * stride_back + c + cols, mask=cm & (row != trash),
                               other=0.0).to(tl.float32)
            tl.store(out + t * stride_out + c + cols, acc.to(out.dtype.element_ty), mask=cm)


def unpack_plan(r: RailRows, node, out: torch.Tensor, block_h: int) -> Plan:
    """The launch plan of out [T, H] (the call's tensor 0, a Live argument: it may be
    fresh per call) = the sum over nodes of the rows r.back returned for each token (fp32
    accumulation, node order): one launch, no temporaries; none for T = 0."""
    T = out.shape[0]
    plan = Plan((out,), "moe_unpack")
    if T:
        plan.launch(unpack_kernel, (grid_programs(node, T),), r.back, r.back.stride(0), r.dest,
                    Live(0), out.stride(0), T, r.nodes, r.rows, H=r.hidden, BLOCK_H=block_h,
                    num_warps=_warps(node))
    return plan


@triton.jit
def dequantize_kernel(q, stride_q, scale, stride_s, ids, stride_ids, out, stride_out, rows,
                      H: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
                      BLOCK_H: tl.constexpr):
    """out[r] = e4m3 bytes q[r] (uint8) times their scales, for every row r in use (an id
    >= 0); unused rows are left as they are (the node's dispatch skips them)."""
    ks = tl.arange(0, KP)
    cols = tl.arange(0, BLOCK_H)
    for r in range(tl.program_id(0), rows, tl.num_programs(0)):
        e = tl.load(ids + r * stride_ids + ks, mask=ks < K, other=-1)
        if tl.max(e) >= 0:
            for c in tl.static_range(0, H, BLOCK_H):
                bits = tl.load(q + r * stride_q + c + cols).to(tl.int32)
                s = tl.load(scale + r * stride_s + (c + cols) // F8.GROUP)
                tl.store(out + r * stride_out + c + cols,
                         F8.dequantized(bits, s, out.dtype.element_ty))


def dequantize_plan(r: RailRows, node, out: torch.Tensor, block_h: int) -> Plan:
    """The launch plan that turns the rows received in fp8 (r.recv in the fp8 layout)
    into out [rows, H] in the dtype: one launch over the rows in use. H is a multiple of
    128, so block_h (buffers.block_h: the largest power of two wasting nothing) divides
    it: no masks."""
    got = r.views(r.recv, r.rows, True)
    plan = Plan((), "moe_dequantize")
    plan.launch(dequantize_kernel, (grid_programs(node, r.rows),), got["q"],
                got["q"].stride(0), got["scale"], got["scale"].stride(0), got["ids"],
                got["ids"].stride(0), out, out.stride(0), r.rows, H=r.hidden, K=r.k,
                KP=max(2, triton.next_power_of_2(r.k)), BLOCK_H=block_h,
                num_warps=_warps(node))
    return plan
