"""DeepEP's low-latency mode (Buffer.low_latency_dispatch / low_latency_combine) over
trident.ExpertParallel.

The layouts are DeepEP's and ExpertParallel's alike: recv_x [L, M * R, H] (M =
num_max_dispatch_tokens_per_rank, R ranks, L = num_experts / R local experts; rows
[0, recv_count[e]) of expert e valid), recv_count [L] int32; with use_fp8, a tuple of the
e4m3 tensor and its fp32 scales [L, M * R, H / 128], column-major in the last two dims
(ExpertParallel writes them so). Within an expert, rows come in arrival order, as in
DeepEP (not grouped by source rank; DeepEP's layout_range is not kept, see the handle).

Each (M, num_experts) gets two BF16 ExpertParallel objects, made on the first call with
that call's hidden size and top-k (a collective: every rank makes the same calls), used in
turn by successive dispatches: DeepEP's two low-latency buffers, so two micro-batches may
be in flight (dispatch A, dispatch B, combine A, combine B). One hidden size and top-k
per (M, num_experts), as DeepEP sizes its buffer for one hidden size: another raises
ExpertParallel's ValueError. A warm call is the ExpertParallel call plus a dictionary
look-up, the handle and the result's tuple (bench/deep_ep_host_cost.py).

return_recv_hook=True is ExpertParallel's split mode: the call queues the send half and
returns; hook() queues the receive half (no SMs are held in between). -1 in topk_idx
selects no expert (ExpertParallel(allow_minus_one=True)); other bad ids raise a
ValueError at the next ctx.sync() / barrier, as ExpertParallel's.
"""
from __future__ import annotations

import torch

from ...moe import ExpertParallel
from .events import NO_EVENT, EventHandle, EventOverlap, refuse


class LowLatencyHandle:
    """What low_latency_dispatch returns as `handle`, for low_latency_combine. DeepEP's
    handle is (recv_src_info, recv_layout_range, M, hidden, num_experts): items 2-4 are
    here too; 0 and 1 are not (ExpertParallel keeps its routing on the device in its own
    layout), and reading them raises NotImplementedError."""
    __slots__ = ("ep", "dispatched", "pending", "stats")

    def __init__(self, ep, dispatched, pending, stats):
        self.ep, self.dispatched, self.pending, self.stats = ep, dispatched, pending, stats

    def receive(self) -> None:
        """The hook of return_recv_hook=True: queue the receive half of the dispatch."""
        if self.pending is not None:
            self.pending.wait()
            self.pending = None
            if self.stats is not None:
                self.stats.add_(self.dispatched.expert_num_tokens)

    def __len__(self) -> int:
        return 5

    def __getitem__(self, i):
        if i in (2, -3):
            return self.ep.max_num_tokens
        if i in (3, -2):
            return self.ep.hidden_dim
        if i in (4, -1):
            return self.ep.num_experts
        if i in (0, 1, -5, -4):
            refuse(f"handle[{i}] (DeepEP's recv_src_info / recv_layout_range)",
                   "trident keeps the routing on the device in ExpertParallel's layout; "
                   "pass the handle to low_latency_combine")
        raise IndexError(f"handle index {i} out of range (5 items)")


def _check_stats(stats, L: int) -> None:
    if (not isinstance(stats, torch.Tensor) or stats.dtype != torch.int32
            or tuple(stats.shape) != (L,) or not stats.is_contiguous()):
        raise ValueError(f"low_latency_dispatch: cumulative_local_expert_recv_stats must be a "
                         f"contiguous int32 tensor of shape [num_local_experts] = [{L}]")


class LowLatencyMethods:
    """Buffer's low-latency calls (a mixin of buffer.Buffer, which sets ctx, _ll,
    _zero_copy, _cuda, and has _destroyed)."""

    def reset(self) -> None:
        """ctx.reset() calls this (the Buffer registers with its context): every pair of
        low-latency buffers takes its turns from the first again, alike on every rank (a
        call refused on some ranks only left the ranks' turns apart). Not DeepEP's."""
        for pair in self._ll.values():
            pair[2] = 1

    def _ll_pair(self, x, topk_idx, m: int, num_experts: int):
        """The two ExpertParallel objects of (m, num_experts), for x's hidden size and
        topk_idx's top-k (made now, on first use: collective)."""
        if not self.low_latency_mode:
            raise ValueError("low_latency_dispatch: this Buffer was made with "
                             "low_latency_mode=False; DeepEP's low-latency calls need "
                             "Buffer(..., low_latency_mode=True)")
        if not (isinstance(x, torch.Tensor) and x.dim() == 2 and isinstance(topk_idx, torch.Tensor)
                and topk_idx.dim() == 2):
            raise ValueError("low_latency_dispatch: x must be a [num_tokens, hidden] tensor "
                             "and topk_idx a [num_tokens, num_topk] tensor")
        hidden, k = x.shape[1], topk_idx.shape[1]
        for name, v in (("num_max_dispatch_tokens_per_rank", m), ("num_experts", num_experts)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"low_latency_dispatch: {name} must be a positive int, "
                                 f"got {v!r}")
        # BF16, as DeepEP's low-latency calls (another x dtype: TypeError at the dispatch)
        eps = [ExpertParallel(self.ctx, num_experts, k, hidden, m, dtype=torch.bfloat16,
                              allow_minus_one=True) for _ in range(2)]
        pair = self._ll[(m, num_experts)] = [eps[0], eps[1], 1]
        return pair

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank: int,
                             num_experts: int, cumulative_local_expert_recv_stats=None,
                             dispatch_wait_recv_cost_stats=None, use_fp8: bool = True,
                             round_scale: bool = False, use_ue8m0: bool = False,
                             async_finish: bool = False, return_recv_hook: bool = False):
        """DeepEP's low_latency_dispatch: x [T, H] (T <= M), topk_idx [T, k] int64 (-1: no
        expert). Returns (recv_x, recv_count, handle, event, hook): recv_x
        [L, M * R, H] (use_fp8: (e4m3 tensor, fp32 scales [L, M * R, H / 128],
        column-major)), recv_count [L] int32, hook None unless return_recv_hook."""
        if self.ctx is None:
            raise self._destroyed("low_latency_dispatch")
        try:      # refused on this rank: its peers stop at once naming it (fail_call)
            if round_scale or use_ue8m0 or dispatch_wait_recv_cost_stats is not None \
                    or (async_finish and return_recv_hook):
                _refuse_dispatch(round_scale, use_ue8m0, dispatch_wait_recv_cost_stats)
            pair = self._ll.get((num_max_dispatch_tokens_per_rank, num_experts))
            if pair is None:
                pair = self._ll_pair(x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts)
            stats = cumulative_local_expert_recv_stats
            if stats is not None:
                _check_stats(stats, pair[0].num_local_experts)
        except (TypeError, ValueError, NotImplementedError) as exc:
            raise self.ctx.fail_call("low_latency_dispatch", exc) from None
        i = pair[2] = 1 - pair[2]
        ep = pair[i]
        if return_recv_hook:
            pending = ep.dispatch(x, topk_idx, wait=False, fp8=use_fp8)
            d = pending.result
            handle = LowLatencyHandle(ep, d, pending, stats)
            hook = handle.receive
        else:
            d = ep.dispatch(x, topk_idx, fp8=use_fp8)
            handle = LowLatencyHandle(ep, d, None, None)
            hook = None
            if stats is not None:
                stats.add_(d.expert_num_tokens)
        return ((d.expert_x, d.expert_x_scale) if use_fp8 else d.expert_x, d.expert_num_tokens,
                handle, EventOverlap(EventHandle(self._cuda)) if async_finish else NO_EVENT,
                hook)

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt: bool = False,
                            zero_copy: bool = False, async_finish: bool = False,
                            return_recv_hook: bool = False, out=None,
                            combine_wait_recv_cost_stats=None):
        """DeepEP's low_latency_combine: x [L, M * R, H] (the experts' outputs, rows as
        dispatched), topk_idx / topk_weights [T, k] of the dispatch; returns (combined_x
        [T, H] = sum_k topk_weights[t, k] * x[row of (t, k)], event, hook). The rows of
        (t, k) are the ones its dispatch recorded: topk_idx must be the dispatch's (as in
        DeepEP, whose kernels read it), and is not read again here."""
        if self.ctx is None:
            raise self._destroyed("low_latency_combine")
        try:      # refused on this rank: its peers stop at once naming it (fail_call)
            if use_logfmt or combine_wait_recv_cost_stats is not None \
                    or (async_finish and return_recv_hook):
                _refuse_combine(use_logfmt, combine_wait_recv_cost_stats)
            if handle.__class__ is not LowLatencyHandle:
                raise TypeError(f"low_latency_combine: handle must be what "
                                f"low_latency_dispatch returned, got {type(handle).__name__}")
            if handle.pending is not None:
                raise ValueError("low_latency_combine: the dispatch was made with "
                                 "return_recv_hook=True and its hook() was not called yet")
        except (TypeError, ValueError, NotImplementedError) as exc:
            raise self.ctx.fail_call("low_latency_combine", exc) from None
        ep, d = handle.ep, handle.dispatched
        if zero_copy:
            x = self._combine_buffer(ep)
        if out is None:
            out = torch.empty(d.num_tokens, ep.hidden_dim, dtype=ep.dtype, device=self.ctx.device)
        if return_recv_hook:
            hook = ep.combine(x, d, topk_weights, wait=False, out=out).wait
        else:
            ep.combine(x, d, topk_weights, out=out)
            hook = None
        return out, EventOverlap(EventHandle(self._cuda)) if async_finish else NO_EVENT, hook

    def get_next_low_latency_combine_buffer(self, handle):
        """The [L, M * R, H] tensor that low_latency_combine(..., zero_copy=True) reads
        for this handle's dispatch (fill it with the experts' outputs)."""
        if self.ctx is None:
            raise self._destroyed("get_next_low_latency_combine_buffer")
        if not isinstance(handle, LowLatencyHandle):
            raise TypeError("get_next_low_latency_combine_buffer: handle must be what "
                            "low_latency_dispatch returned")
        return self._combine_buffer(handle.ep)

    def _combine_buffer(self, ep) -> torch.Tensor:
        """zero_copy's buffer of `ep` (local memory, made on first use)."""
        buf = self._zero_copy.get(ep)
        if buf is None:
            buf = self._zero_copy[ep] = torch.empty(
                ep.num_local_experts, ep.capacity, ep.hidden_dim, dtype=ep.dtype,
                device=self.ctx.device)
        return buf

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int,
                                 num_experts: int) -> None:
        """A no-op: trident's buffers carry epochs and never need cleaning (DeepEP's must
        be zeroed after normal-mode use)."""
        if self.ctx is None:
            raise self._destroyed("clean_low_latency_buffer")

    def low_latency_update_mask_buffer(self, rank_to_mask: int, mask: bool = False):
        refuse("low_latency_update_mask_buffer", "rank masking (DeepEP's shrink mode)")

    def low_latency_query_mask_buffer(self, mask_status):
        refuse("low_latency_query_mask_buffer", "rank masking (DeepEP's shrink mode)")

    def low_latency_clean_mask_buffer(self):
        refuse("low_latency_clean_mask_buffer", "rank masking (DeepEP's shrink mode)")


def _refuse_dispatch(round_scale, use_ue8m0, wait_stats) -> None:
    _refuse_first([(round_scale, "round_scale=True", "FP8 scales are the plain amax / 448 "
                    "(DeepEP's default), not rounded to powers of two"),
                   (use_ue8m0, "use_ue8m0=True", "UE8M0 (packed exponent) scales"),
                   (wait_stats is not None, "dispatch_wait_recv_cost_stats",
                    "per-rank receive wait times are not measured")], "low_latency_dispatch")


def _refuse_combine(use_logfmt, wait_stats) -> None:
    _refuse_first([(use_logfmt, "use_logfmt=True", "LogFMT combine; combine sends the "
                    "experts' dtype"),
                   (wait_stats is not None, "combine_wait_recv_cost_stats",
                    "per-rank receive wait times are not measured")], "low_latency_combine")


def _refuse_first(options, call: str) -> None:
    """Refuse the first unsupported option set; else the call combined async_finish with
    return_recv_hook, which DeepEP forbids too."""
    for given, argument, why in options:
        if given:
            refuse(argument, why)
    raise ValueError(f"{call}: async_finish and return_recv_hook cannot both be set (as in "
                     f"DeepEP)")
