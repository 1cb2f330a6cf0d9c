"""ExpertParallel: MoE dispatch and combine over the symmetric heap (the host side).

    ep = td.ExpertParallel(ctx, num_experts, experts_per_token, hidden_dim, max_num_tokens)
    d = ep.dispatch(x, topk_idx)              # d.expert_x [L, cap, H], d.expert_num_tokens [L]
    y = ep.combine(expert_y, d, topk_weights) # [T, H]

Rank r owns experts [r*L, (r+1)*L). Each call is two kernel launches (send, receive) with
no host synchronisation except the optional input check (`validate`, below). Pass
wait=False to get the send half only; the handle's .wait() launches the receive half, so
other GPU work can run in between while the data is in flight.

Lifetime: expert_x and expert_num_tokens are this object's buffers, overwritten by the
next dispatch; one dispatch/combine round may be in flight per ExpertParallel (use one
object per micro-batch to overlap two). Every rank must make the same calls in the same
order (T may differ).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from ..trace import kernel_args
from . import buffers as B
from .combine import combine_recv_kernel, combine_send_kernel
from .dispatch import dispatch_recv_kernel, dispatch_send_kernel

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass
class Dispatched:
    """What dispatch returns: the experts' inputs, and what combine needs to route back."""
    expert_x: torch.Tensor           # [L, cap, H]: rows [0, expert_num_tokens[e]) are valid
    expert_num_tokens: torch.Tensor  # [L] int32, on the device
    num_tokens: int                  # T of this rank's dispatch
    has_weights: bool = False        # topk_weights travelled with the tokens
    _seq: int = 0


class PendingDispatch:
    """The send half of a dispatch is queued; .wait() queues the receive half."""

    def __init__(self, ep: "ExpertParallel", result: Dispatched):
        self._ep, self._result, self._done = ep, result, False

    def wait(self) -> Dispatched:
        if not self._done:
            self._ep._dispatch_recv()
            self._done = True
        return self._result


class PendingCombine:
    """The send half of a combine is queued; .wait() queues the receive half, returns y."""

    def __init__(self, ep: "ExpertParallel", out: torch.Tensor):
        self._ep, self._out, self._done = ep, out, False

    def wait(self) -> torch.Tensor:
        if not self._done:
            self._ep._combine_recv(self._out)
            self._done = True
        return self._out


class ExpertParallel:
    """Expert-parallel dispatch/combine for `num_experts` experts spread over the ranks.

    validate=True (default) checks topk_idx for ids out of range and duplicate experts
    within a token: that costs one device->host synchronisation per dispatch. Turn it off
    (here or per call) on the hot path; it is skipped anyway during CUDA graph capture.
    Unchecked bad ids are dropped by the kernels and never write out of bounds.
    Shapes, dtypes and T <= max_num_tokens are always checked (free: host metadata).
    """

    def __init__(self, ctx, num_experts: int, experts_per_token: int, hidden_dim: int,
                 max_num_tokens: int, dtype: torch.dtype = torch.bfloat16,
                 validate: bool = True):
        world = ctx.world_size
        for name, v in (("num_experts", num_experts), ("experts_per_token", experts_per_token),
                        ("hidden_dim", hidden_dim), ("max_num_tokens", max_num_tokens)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"ExpertParallel: {name} must be a positive int, got {v!r}")
        if num_experts % world:
            raise ValueError(f"ExpertParallel: num_experts ({num_experts}) must be a multiple "
                             f"of the world size ({world}): rank r owns experts [r*L, (r+1)*L)")
        if experts_per_token > num_experts:
            raise ValueError(f"ExpertParallel: experts_per_token ({experts_per_token}) exceeds "
                             f"num_experts ({num_experts}); experts of a token must differ")
        if dtype not in _DTYPES:
            raise TypeError(f"ExpertParallel: dtype must be one of {_DTYPES}, got {dtype}")
        self.ctx = ctx
        self.num_experts, self.experts_per_token = num_experts, experts_per_token
        self.hidden_dim, self.max_num_tokens, self.dtype = hidden_dim, max_num_tokens, dtype
        self.num_local_experts = num_experts // world
        self.validate = validate
        self.buf = B.Buffers(ctx, self.num_local_experts, experts_per_token, hidden_dim,
                             max_num_tokens, dtype)
        self.capacity = self.buf.cap
        ctx.register_reset(self)
        self.block_h = B.block_h(hidden_dim)
        if ctx.backend == "cuda":
            sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count
            self.max_programs, self.num_warps = 2 * sms, 4
        else:
            self.max_programs, self.num_warps = 3, 1   # emulation: few programs, still > 1
        self._seq = 0
        self._result: Dispatched | None = None
        ctx.barrier()      # every rank's flags are zero before anyone signals

    @staticmethod
    def heap_bytes(world_size: int, experts_per_token: int, hidden_dim: int,
                   max_num_tokens: int, dtype: torch.dtype = torch.bfloat16) -> int:
        """Symmetric-heap bytes an ExpertParallel of this shape allocates (size the heap)."""
        return B.Buffers.heap_bytes(world_size, experts_per_token, hidden_dim, max_num_tokens,
                                    dtype) + 4096

    # ------------------------------------------------------------------ checks
    def _check_tokens(self, x: torch.Tensor, topk_idx: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or not isinstance(topk_idx, torch.Tensor):
            raise TypeError("dispatch: x and topk_idx must be torch.Tensors")
        H, k, M = self.hidden_dim, self.experts_per_token, self.max_num_tokens
        if x.dim() != 2 or x.shape[1] != H:
            raise ValueError(f"dispatch: x must be [T, {H}], got {list(x.shape)}")
        if x.dtype != self.dtype:
            raise TypeError(f"dispatch: x must be {self.dtype} (this ExpertParallel's dtype), "
                            f"got {x.dtype}")
        if x.shape[0] > M:
            raise ValueError(f"dispatch: T = {x.shape[0]} tokens exceeds max_num_tokens = {M}")
        if topk_idx.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"dispatch: topk_idx must be int32 or int64, got {topk_idx.dtype}")
        if topk_idx.dim() != 2 or tuple(topk_idx.shape) != (x.shape[0], k):
            raise ValueError(f"dispatch: topk_idx must be [T, experts_per_token] = "
                             f"[{x.shape[0]}, {k}], got {list(topk_idx.shape)}")
        for name, t in (("x", x), ("topk_idx", topk_idx)):
            if t.device != self.ctx.device:
                raise ValueError(f"dispatch: {name} must be on {self.ctx.device}, got {t.device}")
        if x.stride(1) != 1:
            raise ValueError("dispatch: x must have contiguous rows (x.stride(1) == 1)")

    def _check_weights(self, w, T: int, op: str) -> None:
        k = self.experts_per_token
        if not isinstance(w, torch.Tensor) or tuple(w.shape) != (T, k):
            got = list(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
            raise ValueError(f"{op}: topk_weights must be [T, experts_per_token] = [{T}, {k}], "
                             f"got {got}")
        if w.dtype != torch.float32:
            raise TypeError(f"{op}: topk_weights must be float32, got {w.dtype}")
        if w.device != self.ctx.device:
            raise ValueError(f"{op}: topk_weights must be on {self.ctx.device}, got {w.device}")

    def _check_ids(self, topk_idx: torch.Tensor) -> None:
        """Ids in range and distinct within each token: one device->host sync."""
        E = self.num_experts
        bad_range = (topk_idx < 0) | (topk_idx >= E)
        srt = topk_idx.sort(dim=1).values
        dup = srt[:, 1:] == srt[:, :-1]
        flags = torch.stack([bad_range.any(), dup.any()]).tolist()
        if flags[0]:
            t, j = (int(v) for v in bad_range.nonzero()[0].tolist())
            raise ValueError(f"dispatch: topk_idx[{t}, {j}] = {int(topk_idx[t, j])} is not an "
                             f"expert id in [0, {E})")
        if flags[1]:
            t = int(dup.any(dim=1).nonzero()[0, 0])
            raise ValueError(f"dispatch: token {t} lists an expert twice: topk_idx[{t}] = "
                             f"{topk_idx[t].tolist()} (the experts of a token must differ)")

    def _validating(self, validate: bool | None) -> bool:
        on = self.validate if validate is None else validate
        if on and self.ctx.backend == "cuda" and torch.cuda.is_current_stream_capturing():
            return False
        return on

    def _grid(self, work: int) -> int:
        return max(1, min(work, self.max_programs))

    # ------------------------------------------------------------------ dispatch
    def reset(self) -> None:
        """Epochs, flags and counters back to zero (ctx.reset() calls this on every rank
        after a failure); a Dispatched from before the reset can no longer be combined."""
        self.buf.reset()
        self._seq += 1

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, wait: bool = True,
                 validate: bool | None = None, topk_weights: torch.Tensor | None = None):
        """Send every token to the ranks owning its experts; returns a Dispatched (or, with
        wait=False, a PendingDispatch whose .wait() returns it).

        topk_weights [T, k] float32, optional: send the weights with the tokens (32 bytes
        per token and rank); combine may then be called without them, and its send half
        waits for nothing.
        """
        self._check_tokens(x, topk_idx)
        if topk_weights is not None:
            self._check_weights(topk_weights, x.shape[0], "dispatch")
        if self._validating(validate) and x.shape[0] > 0:
            self._check_ids(topk_idx)
        ctx, b = self.ctx, self.buf
        T = x.shape[0]
        topk_idx = topk_idx.contiguous()
        has_w = topk_weights is not None
        w = topk_weights.contiguous() if has_w else b.dweights
        trace_buf, trace = kernel_args(ctx)
        dispatch_send_kernel[(self._grid(T),)](
            x, x.stride(0), topk_idx, w, T, b.tokens, b.meta, b.dweights, b.flags, b.state,
            b.slot_counter,
            b.send_slot, ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank, ctx.world_size,
            self.max_num_tokens, self.num_local_experts, self.num_experts,
            H=self.hidden_dim, K=self.experts_per_token, KP=b.kp, WP=b.wp, HAS_WEIGHTS=has_w,
            BLOCK_H=self.block_h, TRACE=trace, num_warps=self.num_warps)
        ctx.after_op()
        self._seq += 1
        self._result = Dispatched(b.expert_x, b.expert_num_tokens, T, has_w, self._seq)
        pending = PendingDispatch(self, self._result)
        return pending.wait() if wait else pending

    def _dispatch_recv(self) -> None:
        ctx, b = self.ctx, self.buf
        trace_buf, trace = kernel_args(ctx)
        # the number received is known on the device only: size the grid for the worst case
        grid = self._grid(self.max_num_tokens * ctx.world_size)
        dispatch_recv_kernel[(grid,)](
            b.tokens, b.meta, b.flags, b.state, b.expert_counter, b.token_rows, b.recv_count,
            b.expert_x, b.expert_num_tokens, ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank,
            ctx.world_size, self.max_num_tokens, self.num_local_experts, self.capacity,
            H=self.hidden_dim, KP=b.kp, WP=b.wp,
            BLOCK_L=min(1024, triton.next_power_of_2(self.num_local_experts)),
            BLOCK_H=self.block_h, TRACE=trace, num_warps=self.num_warps)
        ctx.after_op()

    # ------------------------------------------------------------------ combine
    def combine(self, expert_y: torch.Tensor, d: Dispatched,
                topk_weights: torch.Tensor | None = None, wait: bool = True,
                out: torch.Tensor | None = None):
        """y[t] = sum_k topk_weights[t, k] * expert_y[row of (t, k)] (fp32 accumulation),
        in x's dtype; with wait=False, a PendingCombine whose .wait() returns y.

        topk_weights may be None when dispatch was given them. Given here, they are first
        pushed to the expert ranks, and the expert side waits for a peer's weights before
        its first token from that peer (a wait as long as the ranks' skew).
        """
        T = self._check_combine(expert_y, d, topk_weights, out)
        ctx, b = self.ctx, self.buf
        if out is None:
            out = torch.empty(T, self.hidden_dim, dtype=self.dtype, device=ctx.device)
        at_dispatch = topk_weights is None
        topk_weights = b.dweights if at_dispatch else topk_weights.contiguous()
        expert_y = expert_y.contiguous()
        weight_programs = 0 if at_dispatch else \
            max(1, min(triton.cdiv(T, 64), self.max_programs // 4))
        expert_programs = self._grid(self.max_num_tokens * ctx.world_size)
        trace_buf, trace = kernel_args(ctx)
        combine_send_kernel[(weight_programs + expert_programs,)](
            expert_y, topk_weights, T, b.send_slot, b.token_rows, b.recv_count,
            b.dweights if at_dispatch else b.weights, b.partial, b.flags, b.state, ctx.ctrl,
            ctx.heap_bases, trace_buf, ctx.rank, ctx.world_size, self.max_num_tokens,
            weight_programs, H=self.hidden_dim, K=self.experts_per_token, KP=b.kp, WP=b.wp,
            WEIGHTS_AT_DISPATCH=at_dispatch, BLOCK_T=64,
            BLOCK_H=self.block_h, TRACE=trace, num_warps=self.num_warps)
        ctx.after_op()
        pending = PendingCombine(self, out)
        return pending.wait() if wait else pending

    def _combine_recv(self, out: torch.Tensor) -> None:
        ctx, b = self.ctx, self.buf
        T = out.shape[0]
        trace_buf, trace = kernel_args(ctx)
        combine_recv_kernel[(self._grid(T),)](
            out, T, b.send_slot, b.partial, b.flags, b.state, ctx.ctrl, ctx.heap_bases,
            trace_buf, ctx.rank, ctx.world_size, self.max_num_tokens,
            H=self.hidden_dim, WP=b.wp, BLOCK_H=self.block_h, TRACE=trace,
            num_warps=self.num_warps)
        ctx.after_op()

    def _check_combine(self, expert_y, d, topk_weights, out) -> int:
        if not isinstance(d, Dispatched):
            raise TypeError(f"combine: d must be what dispatch returned (a Dispatched; call "
                            f".wait() on a PendingDispatch), got {type(d).__name__}")
        if d._seq != self._seq:
            raise ValueError("combine: d is from an earlier dispatch; its buffers have been "
                             "reused since. Combine the latest dispatch (one round in flight "
                             "per ExpertParallel)")
        T, H = d.num_tokens, self.hidden_dim
        shape = (self.num_local_experts, self.capacity, H)
        if not isinstance(expert_y, torch.Tensor) or tuple(expert_y.shape) != shape:
            got = list(expert_y.shape) if isinstance(expert_y, torch.Tensor) else type(expert_y)
            raise ValueError(f"combine: expert_y must be [L, cap, H] = {list(shape)}, got {got}")
        if expert_y.dtype != self.dtype:
            raise TypeError(f"combine: expert_y must be {self.dtype}, got {expert_y.dtype}")
        if topk_weights is None:
            if not d.has_weights:
                raise ValueError("combine: topk_weights is needed (dispatch was not given them)")
        else:
            self._check_weights(topk_weights, T, "combine")
        if expert_y.device != self.ctx.device:
            raise ValueError(f"combine: expert_y must be on {self.ctx.device}, "
                             f"got {expert_y.device}")
        if out is not None and (tuple(out.shape) != (T, H) or out.dtype != self.dtype
                                or not out.is_contiguous() or out.device != self.ctx.device):
            raise ValueError(f"combine: out must be a contiguous [{T}, {H}] {self.dtype} tensor "
                             f"on {self.ctx.device}")
        return T

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Free the heap buffers (collective: every rank, same order as other frees)."""
        if self.buf is not None:
            self.ctx.barrier()
            self.buf.free(self.ctx)
            self.buf = None

    def __enter__(self) -> "ExpertParallel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"trident.ExpertParallel(num_experts={self.num_experts}, "
                f"experts_per_token={self.experts_per_token}, hidden_dim={self.hidden_dim}, "
                f"max_num_tokens={self.max_num_tokens}, dtype={self.dtype}, "
                f"world_size={self.ctx.world_size})")
