"""ExpertParallel over a world of several nodes (what td.ExpertParallel(ctx, ...) makes
when ctx spans nodes: WorldContext.expert_parallel_class, world.py): DeepEP's two-stage
route with NCCL between nodes.

dispatch: the sender checks the expert ids on the device and packs (one kernel,
rail_route.pack_kernel) each token once per node that owns any of its experts into that node's block of
fixed-capacity rows (rail_route.py), and one all_to_all on its rail (the ranks of its
local index on every node; torch.distributed: NCCL on GPUs, gloo on the CPU emulation)
carries every block to the rank of the same local index on its node. That rank forwards
the rows it received over NVLink with one node's ExpertParallel (`self.node_ep`, on
ctx.node), whose expert_x / expert_num_tokens are the result: rank r of the world owns
experts [r*L, (r+1)*L) as on one node. combine mirrors it: the node's combine returns to
the forwarding rank, per row, the weighted sum over that node's experts; one all_to_all
on the rail sends the rows back, and the sender adds its token's rows from each node
(fp32, node order).

Every size is fixed on the host (a node's block holds max_num_tokens rows; the rows in
use say so in their ids), so a call has no host synchronisation and, with NCCL, can be
captured into a CUDA graph after an eager warm-up. The price is the network bytes: every
block is sent whole (docs/nodes.md, "Scale: past one node", has the figures).

Split mode: dispatch(wait=False) queues the check, the packing, the rail exchange and the
node's send half; .wait() the node's receive half. combine(wait=False) queues the node's
send half; .wait() the node's receive half, the rail exchange back and the sum. On GPUs
with NCCL the rail exchange and the node's send half of dispatch run on a side stream, so
work queued between dispatch and .wait() overlaps the network transfer.

fp8=True quantises each token once at the sender (fp8.quantize) and sends e4m3 bytes plus
scales over the network (about half of bf16's bytes). The forwarding rank dequantises
them to the dtype (rail_route.dequantize_kernel) and the node's fp8 dispatch quantises again: the e4m3 values come out
the same, each scale within the dtype's rounding (2^-9 relative for bf16) of the sender's.
"""
from __future__ import annotations

import torch

from ..moe import fp8 as F8
from ..moe.expert_parallel import (_IDS, Dispatched, ExpertParallel, PendingCombine,
                                  PendingDispatch, check_args)
from ..moe.plans import _check_combine, _check_tokens, _check_weights, cached, check_open
from ..runtime.errors import Failure, PeerFailed
from ..runtime.plans import live_key, tensor_key
from . import rail
from . import rail_route as RR


class ExpertParallelAcrossNodes:
    """ExpertParallel over M nodes of L ranks (see the module docstring); the API, checks
    and results are ExpertParallel's. Attributes as ExpertParallel's, plus node_ep (the
    node-local ExpertParallel that forwards) and rail_rows (the network buffers)."""

    def __init__(self, ctx, num_experts: int, experts_per_token: int, hidden_dim: int,
                 max_num_tokens: int, dtype: torch.dtype = torch.bfloat16,
                 validate: bool = True, high_throughput: bool | None = None,
                 num_sms: int | None = None):
        node = ctx.node
        refused = None
        try:
            check_args(ctx.world_size, num_experts, experts_per_token, hidden_dim,
                       max_num_tokens, dtype)
        except (TypeError, ValueError) as exc:
            # this node's peers stop at once in their ExpertParallel's barrier, naming it
            refused = node.fail_call("ExpertParallel", exc)
        topo = ctx.topology
        self.ctx, self.topology = ctx, topo
        self.num_experts, self.experts_per_token = num_experts, experts_per_token
        self.hidden_dim, self.max_num_tokens, self.dtype = hidden_dim, max_num_tokens, dtype
        self.num_local_experts = num_experts // ctx.world_size
        self.experts_per_node = self.num_local_experts * topo.node_size
        self.validate = bool(validate)
        if high_throughput is None:
            high_throughput = max_num_tokens >= ctx.options.moe_ht_min_tokens
        # the forwarding stage: rows from every node's rank of this local index
        self.node_ep = None
        if refused is None:
            try:
                self.node_ep = ExpertParallel(node, self.experts_per_node, experts_per_token,
                                              hidden_dim, topo.num_nodes * max_num_tokens,
                                              dtype, validate=False,
                                              high_throughput=high_throughput,
                                              num_sms=num_sms)
            except Exception as exc:      # noqa: BLE001 -- the world hears of it first
                refused = exc
        _agree(ctx, self.node_ep, refused)
        self.capacity = self.node_ep.capacity
        self.sms = self.node_ep.sms
        self.high_throughput = self.node_ep.high_throughput
        self.rail_rows = RR.RailRows(topo.num_nodes, max_num_tokens, hidden_dim,
                                     experts_per_token, dtype, node.device)
        self._node_y = torch.empty(self.rail_rows.rows, hidden_dim, dtype=dtype,
                                   device=node.device)
        self._fwd_x = None                 # fp8: the dequantised rows (made at first use)
        self._side = (torch.cuda.Stream(node.device) if node.device.type == "cuda"
                      and not rail.staged(node, topo.rail_group) else None)
        self._seq, self._id = 0, next(_IDS)
        self._node_d = self._node_pending = self._combine_pending = self._result = None
        self._unpack = None                # combine's last step (a plan's run)
        node.register_reset(self)

    @staticmethod
    def heap_bytes(num_nodes: int, node_size: int, experts_per_token: int, hidden_dim: int,
                   max_num_tokens: int, dtype: torch.dtype = torch.bfloat16) -> int:
        """Symmetric-heap bytes per rank (each node's heap) of one of this shape."""
        return ExpertParallel.heap_bytes(node_size, experts_per_token, hidden_dim,
                                         num_nodes * max_num_tokens, dtype)

    def reset(self) -> None:
        """After ctx.reset(): a Dispatched from before can no longer be combined (the
        node's ExpertParallel resets its own state). Nothing once closed."""
        if self.rail_rows is None:
            return
        self._seq += 1
        self._node_pending = self._combine_pending = None
        self.rail_rows.reset()

    # ------------------------------------------------------------------ dispatch
    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, wait: bool = True,
                 validate: bool | None = None, topk_weights: torch.Tensor | None = None,
                 fp8: bool = False):
        """As ExpertParallel.dispatch: every token to the ranks owning its experts, across
        nodes; returns a Dispatched (or, with wait=False, a PendingDispatch)."""
        ctx, node = self.ctx, self.ctx.node
        fp8, has_w = bool(fp8), topk_weights is not None
        check = self.validate if validate is None else bool(validate)
        key = ("moe_dispatch_across", self._id, tensor_key(x), tensor_key(topk_idx),
               tensor_key(topk_weights) if has_w else None, check, fp8, node.capturing())
        cached(node, key, self._pack_plan, x, topk_idx, topk_weights, check, fp8)()
        T = x.shape[0]
        side = self._side
        if side is not None and not wait:
            side.wait_stream(torch.cuda.current_stream(node.device))
            with torch.cuda.stream(side):
                self._forward(fp8, has_w, wait)
        else:
            self._forward(fp8, has_w, wait)
        self._seq += 1
        nd = self._node_d
        self._result = Dispatched(nd.expert_x, nd.expert_num_tokens, T, has_w, self._seq,
                                  nd.expert_x_scale, self._id)
        if not wait:
            return PendingDispatch(self, self._result)
        if ctx.debug:
            ctx.sync()
        return self._result

    def _pack_plan(self, x, topk_idx, w, check: bool, fp8: bool):
        """dispatch's checks (once per signature, as on one node) and its packing plan."""
        check_open(self.node_ep, "dispatch")
        if fp8:
            F8.check_hidden(self.hidden_dim)
        _check_tokens(self, x, topk_idx)
        if w is not None:
            _check_weights(self, w, x.shape[0], "dispatch")
        return RR.pack_plan(self.rail_rows, self.ctx.node, x, topk_idx, w, check,
                            self.num_experts, self.experts_per_node, fp8,
                            self.node_ep.block_h, self.node_ep.buf.kp)

    def _forward(self, fp8: bool, has_w: bool, wait: bool) -> None:
        """The rail exchange, then the node's dispatch of the rows received (its send half
        only when not `wait`)."""
        node, r = self.ctx.node, self.rail_rows
        rows = r.rows
        send = r.views(r.send, rows, fp8)["rows"]
        got = r.views(r.recv, rows, fp8)
        rail.all_to_all(node, self.topology.rail_group, got["rows"], send)
        if fp8:
            if self._fwd_x is None:
                self._fwd_x = torch.empty(rows, self.hidden_dim, dtype=self.dtype,
                                          device=node.device)
            x = self._fwd_x
            cached(node, ("moe_dequantize_across", self._id, node.capturing()),
                   RR.dequantize_plan, r, node, x, self.node_ep.block_h)()
        else:
            x = got["x"]
        res = self.node_ep.dispatch(x, got["ids"], wait=wait, validate=False,
                                    topk_weights=got["weights"] if has_w else None, fp8=fp8)
        if wait:
            self._node_d, self._node_pending = res, None
        else:
            self._node_d, self._node_pending = res._result, res

    def _dispatch_recv(self, fp8: bool = False, has_weights: bool = False) -> None:
        if self._side is not None:
            torch.cuda.current_stream(self.ctx.node.device).wait_stream(self._side)
        self._node_pending.wait()
        self._node_pending = None

    # ------------------------------------------------------------------ combine
    def combine(self, expert_y: torch.Tensor, d: Dispatched,
                topk_weights: torch.Tensor | None = None, wait: bool = True,
                out: torch.Tensor | None = None):
        """As ExpertParallel.combine: y[t] = sum_k topk_weights[t, k] * expert_y[row of
        (t, k)], across nodes; with wait=False, a PendingCombine."""
        if not isinstance(d, Dispatched):
            raise TypeError(f"combine: d must be what dispatch returned (a Dispatched; call "
                            f".wait() on a PendingDispatch), got {type(d).__name__}")
        if d._owner != self._id:
            raise ValueError("combine: d was returned by the dispatch of another "
                             "ExpertParallel; combine it with the one that dispatched it")
        if d._seq != self._seq or self._node_pending is not None:
            raise ValueError("combine: d is from an earlier dispatch, or its .wait() was not "
                             "called; combine the latest dispatch after its .wait()")
        T, node, has_w = d.num_tokens, self.ctx.node, topk_weights is not None
        if not has_w and not d.has_weights:
            raise ValueError("combine: topk_weights is needed (dispatch was not given them)")
        if out is None:
            out = torch.empty(T, self.hidden_dim, dtype=self.dtype, device=node.device)
        key = ("moe_combine_across", self._id, tensor_key(expert_y),
               tensor_key(topk_weights) if has_w else None, d.has_weights, T, live_key(out),
               node.capturing())
        self._unpack = cached(node, key, self._unpack_plan, expert_y, topk_weights, out, T)
        node_w = self.rail_rows.weights_recv if has_w else None
        if has_w:
            rail.all_to_all(node, self.topology.rail_group, node_w,
                            RR.pack_weights(self.rail_rows, topk_weights))
        res = self.node_ep.combine(expert_y, self._node_d, node_w, wait=wait, out=self._node_y)
        if not wait:
            self._combine_pending = res
            return PendingCombine(self, out)
        self._back(out)
        return out

    def _unpack_plan(self, expert_y, w, out, T: int):
        """combine's checks (once per signature; expert_y's with the node's messages,
        before anything is sent) and the plan of its last step, the sum at the sender."""
        check_open(self.node_ep, "combine")
        node, H = self.ctx.node, self.hidden_dim
        if (not isinstance(out, torch.Tensor) or tuple(out.shape) != (T, H)
                or out.dtype != self.dtype or not out.is_contiguous()
                or out.device != node.device):
            raise ValueError(f"combine: out must be a contiguous [{T}, {H}] {self.dtype} "
                             f"tensor on {node.device}")
        if w is not None:
            _check_weights(self, w, T, "combine")
        node_w = None if w is None else self.rail_rows.weights_recv
        _check_combine(self.node_ep, expert_y, self._node_d, node_w, self._node_y)
        return RR.unpack_plan(self.rail_rows, node, out, self.node_ep.block_h)

    def _combine_recv(self, out: torch.Tensor) -> None:
        pending, self._combine_pending = self._combine_pending, None
        pending.wait()
        self._back(out)

    def _back(self, out: torch.Tensor) -> None:
        r = self.rail_rows
        rail.all_to_all(self.ctx.node, self.topology.rail_group, r.back[:r.rows], self._node_y)
        self._unpack((out,))
        if self.ctx.debug:
            self.ctx.sync()

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Free the node's heap buffers (collective over the world)."""
        if self.node_ep is not None:
            self.node_ep.close()
            self.node_ep = self.rail_rows = None

    def __enter__(self) -> "ExpertParallelAcrossNodes":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        t = self.topology
        return (f"trident.ExpertParallel(num_experts={self.num_experts}, "
                f"experts_per_token={self.experts_per_token}, hidden_dim={self.hidden_dim}, "
                f"max_num_tokens={self.max_num_tokens}, dtype={self.dtype}, "
                f"world_size={self.ctx.world_size}, nodes={t.num_nodes}x{t.node_size})")


def _agree(ctx, node_ep, refused: BaseException | None) -> None:
    """The constructor's agreement over the world: where a rank refused its arguments
    (or its node's ExpertParallel raised), every rank raises, at once: that rank its own
    error, the others PeerFailed naming it (world ranks), not a timeout in a later round
    that the refusing node never joins. One rail barrier (WorldContext._rail_barrier) when
    all is well. A node that made its ExpertParallel frees it again (all of its ranks
    raise together)."""
    topo = ctx.topology
    mine = None
    if isinstance(refused, PeerFailed):            # a peer of this node refused
        # it names ranks of the node: the world's are the node's first rank's on
        first = topo.node * topo.node_size
        mine = refused.renumbered(lambda r: first + r, "ExpertParallel")
    elif refused is not None:                      # this rank refused
        mine = PeerFailed("ExpertParallel", ctx.rank, ctx.rank,
                          Failure.of(refused, ctx.rank, "ExpertParallel"))
    try:
        ctx._rail_barrier(mine)
    except PeerFailed as first:                    # a rank of another node refused
        if node_ep is not None:
            node_ep.close()
        raise PeerFailed("ExpertParallel", ctx.rank, first.peer, first.cause) from None
    if refused is not None:
        raise refused if mine.peer == ctx.rank else mine
