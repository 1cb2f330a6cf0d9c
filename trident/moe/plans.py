"""The launch plans of ExpertParallel's calls (see trident/runtime/plans.py for what a plan is).

A plan is built on the first call with a signature (which ExpertParallel, each tensor's
address, shape, strides and dtype, T, wait, validate, whether a CUDA graph is being
captured): the inputs are checked, the grids sized and every kernel argument packed.
Later calls only launch. Strides are kernel arguments, so no input is ever copied to
make it contiguous. Combine's `out` is the call's tensor 0 (`Live(0)`): a fresh tensor
per call unless the caller gives one.

With wait=True a call is one launch (PART=BOTH: the send and receive halves in one
grid); with wait=False the plan holds the send half and the handle's .wait() runs the
receive half's plan (PART=RECV), which depends on nothing but the ExpertParallel and T
(and, for dispatch, fp8).

An ExpertParallel built with high_throughput (by default: max_num_tokens >=
ctx.options.moe_ht_min_tokens) launches the kernels of high_throughput.py instead, with
the same arguments plus the chunk flags, and its grids sized by chunks of
buffers.CHUNK_TOKENS tokens instead of tokens. Its combine plans launch PART STAGED
instead of BOTH while HT_COMBINE_STAGED is set (A/B timing of the staged combine).

Every launch of either path, every PART, is made with programmatic dependent launch on
sm_90+ (`_launch`: ccl/common.py pdl_options, as the Lamport collectives' are; never on
the CPU emulation): the GPU may start a kernel while the one before it in the stream
still runs, so that a CUDA graph of small calls hides each launch behind the previous
kernel's tail. The ordering rule: a kernel's first act is griddepcontrol.wait
(buffers.begin_launch), before any global access, so it sees every write of the
kernels before it as in plain stream order; then it lets the next one launch. `PDL =
False` launches them plainly (A/B timing).
"""
from __future__ import annotations

import torch
import triton

from ..ccl.common import pdl_options
from ..ccl.device import fingerprint
from ..runtime.plans import Live, Plan, plan_for
from ..trace import kernel_args
from . import buffers as B
from . import fp8
from .combine import combine_kernel
from .dispatch import dispatch_kernel
from .high_throughput import ht_combine_kernel, ht_dispatch_kernel
from .routing import CHECK_ALLOW_NONE

BLOCK_T = 64      # tokens per step of combine's weight programs
# True: the high-throughput combine's fused launch stages this rank's own partial sums
# (buffers.STAGED, the combine before its one-pass receive), for A/B timing only
# (`trident bench moe --combine-ab`); read when a plan is built
HT_COMBINE_STAGED = False
# True: the kernels are launched with programmatic dependent launch where the GPU has it
# (module docstring); False launches them plainly, for A/B timing (bench/lab/
# kernel_times.py --no-pdl). Read when a plan is built
PDL = True


# ---------------------------------------------------------------------------- checks
# Made once per signature, when the plan is built (a warm call does not repeat them).
def check_open(ep, op: str) -> None:
    """`op` (dispatch, combine) of an ExpertParallel `ep` (None: the node's one of a closed
    ExpertParallel across nodes) after its close(), which freed the buffers, or after its
    context's close(), which unmapped the heap they are on (the context's own error: its
    close() also empties the plan cache, so every call after it comes here)."""
    if ep is None or ep.buf is None:
        raise RuntimeError(f"{op}: this ExpertParallel is closed (close() freed its heap "
                           f"buffers); make a new one")
    ep.ctx._check_open()


def _check_tokens(ep, x: torch.Tensor, topk_idx: torch.Tensor) -> None:
    for name, t in (("x", x), ("topk_idx", topk_idx)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"dispatch: {name} must be a torch.Tensor, got {type(t).__name__}")
    H, k, M = ep.hidden_dim, ep.experts_per_token, ep.max_num_tokens
    if x.dim() != 2 or x.shape[1] != H:
        raise ValueError(f"dispatch: x must be [T, {H}], got {list(x.shape)}")
    if x.dtype != ep.dtype:
        raise TypeError(f"dispatch: x must be {ep.dtype} (this ExpertParallel's dtype), "
                        f"got {x.dtype}")
    if x.shape[0] > M:
        raise ValueError(f"dispatch: T = {x.shape[0]} tokens exceeds max_num_tokens = {M}")
    if topk_idx.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"dispatch: topk_idx must be int32 or int64, got {topk_idx.dtype}")
    if topk_idx.dim() != 2 or tuple(topk_idx.shape) != (x.shape[0], k):
        raise ValueError(f"dispatch: topk_idx must be [T, experts_per_token] = "
                         f"[{x.shape[0]}, {k}], got {list(topk_idx.shape)}")
    for name, t in (("x", x), ("topk_idx", topk_idx)):
        if t.device != ep.ctx.device:
            raise ValueError(f"dispatch: {name} must be on {ep.ctx.device}, got {t.device}")
    if x.stride(1) != 1:
        raise ValueError("dispatch: x must have contiguous rows (x.stride(1) == 1)")


def _check_weights(ep, w, T: int, op: str) -> None:
    k = ep.experts_per_token
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"{op}: topk_weights must be a torch.Tensor [T, experts_per_token] = "
                        f"[{T}, {k}] (or None), got {type(w).__name__}")
    if tuple(w.shape) != (T, k):
        raise ValueError(f"{op}: topk_weights must be [T, experts_per_token] = [{T}, {k}], "
                         f"got {list(w.shape)}")
    if w.dtype != torch.float32:
        raise TypeError(f"{op}: topk_weights must be float32, got {w.dtype}")
    if w.device != ep.ctx.device:
        raise ValueError(f"{op}: topk_weights must be on {ep.ctx.device}, got {w.device}")


def _check_combine(ep, expert_y, d, topk_weights, out) -> int:
    T, H = d.num_tokens, ep.hidden_dim
    shape = (ep.num_local_experts, ep.capacity, H)
    if not isinstance(expert_y, torch.Tensor) or tuple(expert_y.shape) != shape:
        if not isinstance(expert_y, torch.Tensor):
            raise TypeError(f"combine: expert_y must be a torch.Tensor [L, cap, H] = "
                            f"{list(shape)}, got {type(expert_y).__name__}")
        raise ValueError(f"combine: expert_y must be [L, cap, H] = {list(shape)}, "
                         f"got {list(expert_y.shape)}")
    if expert_y.dtype != ep.dtype:
        raise TypeError(f"combine: expert_y must be {ep.dtype}, got {expert_y.dtype}")
    if topk_weights is None:
        if not d.has_weights:
            raise ValueError("combine: topk_weights is needed (dispatch was not given them)")
    else:
        _check_weights(ep, topk_weights, T, "combine")
    if expert_y.device != ep.ctx.device:
        raise ValueError(f"combine: expert_y must be on {ep.ctx.device}, "
                         f"got {expert_y.device}")
    if expert_y.stride(2) != 1:
        raise ValueError(f"combine: expert_y must have contiguous rows (stride(2) == 1), "
                         f"got strides {expert_y.stride()}")
    if (not isinstance(out, torch.Tensor) or tuple(out.shape) != (T, H)
            or out.dtype != ep.dtype or not out.is_contiguous()
            or out.device != ep.ctx.device):
        raise ValueError(f"combine: out must be a contiguous [{T}, {H}] {ep.dtype} tensor "
                         f"on {ep.ctx.device}")
    return T


# ---------------------------------------------------------------------------- plans
def cached(ctx, key, build, *args):
    """The run of `key`'s plan in ctx's cache, built by build(*args) if new, through the
    plan driver (trident/runtime/plans.py plan_for: named after key[0] in the errors of the host
    collectives its build makes). No capture twin: an ExpertParallel's buffers exist
    from its construction, so a capture's first build creates nothing. The caller runs
    the plan, then ctx.after_op() (debug mode's checks)."""
    plan = ctx.plans.get(key)
    if plan is None:
        plan = new_plan(ctx, key, build, args)
    return plan.run


def new_plan(ctx, key, build, args) -> Plan:
    """cached's build, for a key that ctx.plans does not hold (apart: a closure in cached
    would make its variables cells, slower to read on the warm path). ExpertParallel's
    dispatch and combine look their key up in ctx.plans themselves and call this on a
    miss: the warm path without cached's and ExpertParallel._plan's frames."""
    return plan_for(ctx, key, lambda capture: build(*args), twin=False, found=None)


def _launch(ep, plan: Plan, kernel, part, send_programs: int, programs: int, args: dict,
            **constexprs) -> None:
    """Add a launch of `kernel` with every parameter taken by name from the ExpertParallel's
    fixed arguments, then `args` (positionally: Live arguments must be), with the launch
    options of PDL (`PDL`: the kernel's PDL constexpr, and launch_pdl on sm_90+)."""
    ctx, b = ep.ctx, ep.buf
    trace_buf, trace = kernel_args(ctx)
    pdl = pdl_options(ctx, PDL)
    named = dict(
        tokens=b.tokens, meta=b.meta, dweights=b.dweights, partial=b.partial, flags=b.flags,
        fps=b.fps, slots=b.slots, NS=b.ns, chunk_flags=b.chunk_flags, CHUNK=B.CHUNK_TOKENS,
        state=b.state, send_slot=b.send_slot,
        expert_counter=b.expert_counter, token_rows=b.token_rows, recv_count=b.recv_count,
        expert_x=b.expert_x, expert_x_scale=b.recv_count,    # the latter read by fp8 only
        expert_num_tokens=b.expert_num_tokens, ctrl=ctx.ctrl,
        heap_bases=ctx.heap_bases, trace_buf=trace_buf, rank=ctx.rank, world=ctx.world_size,
        max_tokens=ep.max_num_tokens, experts_per_rank=ep.num_local_experts,
        num_experts=ep.num_experts, cap=ep.capacity, send_programs=send_programs, PART=part,
        H=ep.hidden_dim, K=ep.experts_per_token, KP=b.kp, WP=b.wp,
        BLOCK_L=min(1024, triton.next_power_of_2(ep.num_local_experts)),
        BLOCK_H=ep.block_h, BLOCK_T=BLOCK_T, TRACE=trace, PDL=pdl.pop("PDL"))
    named.update(args, **constexprs)
    plan.launch(kernel, (programs,), *(named[name] for name in kernel.arg_names),
                num_warps=ep.num_warps, **pdl)


def _receivers(ep) -> int:
    """Programs of dispatch's receive half / combine's expert side: the number of tokens
    received is known on the device only, so the grid is sized for the worst case (in
    chunks on the high-throughput path)."""
    return _programs(ep, ep.max_num_tokens * ep.ctx.world_size)


def _programs(ep, tokens: int) -> int:
    """Programs for `tokens` items of work: tokens, or chunks of them (high throughput)."""
    return ep.programs(triton.cdiv(tokens, B.CHUNK_TOKENS) if ep.high_throughput else tokens)


def _signallers(ep, tokens: int) -> int:
    """Low-latency path: programs for `tokens` items of work that each signal every rank
    (buffers.py "Low latency"): as many on every rank, whatever its T, so a receiver knows
    whose signals to wait for (the program cap is in the fingerprint: _call)."""
    return min(ep.programs(tokens), ep.buf.ns)


def _weight_programs(ep, T: int) -> int:
    """Combine's weight programs (weights given to combine): per T on the high-throughput
    path; per max_num_tokens on the low-latency one, the same on every rank, as its
    expert programs wait for each of them (_signallers)."""
    n = T if ep.high_throughput else ep.max_num_tokens
    return max(1, min(triton.cdiv(n, BLOCK_T), ep.max_programs // 4))


def _kernels(ep):
    """(dispatch kernel, combine kernel) of the ExpertParallel's path."""
    if ep.high_throughput:
        return ht_dispatch_kernel, ht_combine_kernel
    return dispatch_kernel, combine_kernel


def _call(ep, kernel, *more) -> int:
    """The call's fingerprint (buffers.py "Calls"), once per plan: the kernel (the path,
    and dispatch or combine) and what every rank's ExpertParallel and call must share,
    the program cap too (how many programs signal, _signallers, and how many weight
    programs there are: ExpertParallel's num_sms)."""
    more = (*more, ep.max_programs)
    return fingerprint(kernel, ep.hidden_dim, str(ep.dtype), ep.num_experts,
                       ep.experts_per_token, ep.max_num_tokens, *more)


def _fp8_args(ep) -> dict:
    """fp8 dispatch's views: the receive buffer and expert_x as int32 words (four e4m3
    bytes each), expert_x_scale's fp32 bits as int32 (the kernel copies bits)."""
    fp8.check_hidden(ep.hidden_dim)
    qx, scale = ep.buf.fp8_outputs()
    return dict(tokens=ep.buf.tokens.view(torch.int32), expert_x=qx.view(torch.int32),
                expert_x_scale=scale.view(torch.int32))


def check_code(ep, check: bool) -> int:
    """The kernel's check_ids: 0 (drop bad ids silently), 1 (record them) or
    routing.CHECK_ALLOW_NONE (record them, except -1: ExpertParallel(allow_minus_one))."""
    if not check:
        return 0
    return CHECK_ALLOW_NONE.value if getattr(ep, "allow_minus_one", False) else 1


def _dispatch_senders(ep) -> int:
    return _signallers(ep, ep.max_num_tokens)


def _dispatch_constexprs(ep) -> dict:
    """The low-latency dispatch's: the senders of every rank (peer_programs), and the
    width of the look at their signals (NP)."""
    n = _dispatch_senders(ep)
    return dict(peer_programs=n, NP=triton.next_power_of_2(n))


def _combine_constexprs(ep, weight_programs: int) -> dict:
    """The low-latency combine's: the expert programs of every rank (peer_programs), and
    the width of the look at their signals or at the weight programs' (NP)."""
    n = _signallers(ep, ep.max_num_tokens * ep.ctx.world_size)
    return dict(peer_programs=n, NP=triton.next_power_of_2(max(n, weight_programs)))


def dispatch(ep, x, topk_idx, topk_weights, wait: bool, check: bool, use_fp8: bool) -> Plan:
    check_open(ep, "dispatch")
    if use_fp8:
        fp8.check_hidden(ep.hidden_dim)
    _check_tokens(ep, x, topk_idx)
    T = x.shape[0]
    has_w = topk_weights is not None
    if has_w:
        _check_weights(ep, topk_weights, T, "dispatch")
    w = topk_weights if has_w else ep.buf.dweights       # not read without weights
    senders = _programs(ep, T) if ep.high_throughput else _dispatch_senders(ep)
    # the call's own tensors: a launch keeps only their addresses (the plan's key holds
    # them), never the tensors, so a plan does not keep a caller's input alive
    plan = Plan((x, topk_idx, topk_weights), "moe_dispatch")
    args = dict(x=x, stride_x=x.stride(0), topk_idx=topk_idx, stride_it=topk_idx.stride(0),
                stride_ik=topk_idx.stride(1), topk_weights=w,
                stride_wt=w.stride(0) if has_w else 0, stride_wk=w.stride(1) if has_w else 0,
                num_tokens=T, check_ids=check_code(ep, check),
                fp=_call(ep, _kernels(ep)[0], use_fp8, has_w))
    if use_fp8:
        args.update(_fp8_args(ep))
    args.update(_dispatch_constexprs(ep))
    part, programs = (B.BOTH, senders + _receivers(ep)) if wait else (B.SEND, senders)
    _launch(ep, plan, _kernels(ep)[0], part, senders, programs, args, HAS_WEIGHTS=has_w,
            FP8=use_fp8)
    return plan


def dispatch_recv(ep, use_fp8: bool, has_w: bool) -> Plan:
    """The receive half alone (split mode); the send half's tensors are not read (`has_w`:
    whether the send half had weights, for the fingerprint)."""
    check_open(ep, "dispatch")
    b = ep.buf
    plan = Plan((), "moe_dispatch_recv")
    args = dict(x=b.tokens, stride_x=0, topk_idx=b.meta, stride_it=0, stride_ik=0,
                topk_weights=b.dweights, stride_wt=0, stride_wk=0, num_tokens=0, check_ids=0,
                fp=_call(ep, _kernels(ep)[0], use_fp8, has_w))
    if use_fp8:
        args.update(_fp8_args(ep))
    args.update(_dispatch_constexprs(ep))
    _launch(ep, plan, _kernels(ep)[0], B.RECV, 0, _receivers(ep), args, HAS_WEIGHTS=False,
            FP8=use_fp8)
    return plan


def combine(ep, expert_y, d, topk_weights, out, wait: bool) -> Plan:
    """`out` is the build call's output (tensor 0 of every call)."""
    check_open(ep, "combine")
    T = _check_combine(ep, expert_y, d, topk_weights, out)
    at_dispatch = topk_weights is None
    w = ep.buf.dweights if at_dispatch else topk_weights
    weight_programs = 0 if at_dispatch else _weight_programs(ep, T)
    experts = _receivers(ep) if ep.high_throughput else \
        _signallers(ep, ep.max_num_tokens * ep.ctx.world_size)
    senders = weight_programs + experts
    plan = Plan((out, expert_y, topk_weights), "moe_combine")     # out is Live(0)
    args = dict(expert_y=expert_y, stride_ye=expert_y.stride(0), stride_yr=expert_y.stride(1),
                topk_weights=w, stride_wt=0 if at_dispatch else w.stride(0),
                stride_wk=0 if at_dispatch else w.stride(1), out=Live(0), num_tokens=T,
                weights=ep.buf.dweights if at_dispatch else ep.buf.weights,
                num_weight_programs=weight_programs,
                fp=_call(ep, _kernels(ep)[1], at_dispatch),
                **_combine_constexprs(ep, weight_programs))
    part, programs = (B.BOTH, senders + _programs(ep, T)) if wait else (B.SEND, senders)
    if part == B.BOTH and ep.high_throughput and HT_COMBINE_STAGED:
        part = B.STAGED
    _launch(ep, plan, _kernels(ep)[1], part, senders, programs, args,
            WEIGHTS_AT_DISPATCH=at_dispatch)
    return plan


def combine_recv(ep, T: int, out, at_dispatch: bool) -> Plan:
    """The receive half alone (split mode): sums the partials of T tokens into tensor 0
    (`at_dispatch`: whether the send half's weights came with dispatch, for the
    fingerprint)."""
    check_open(ep, "combine")
    b = ep.buf
    plan = Plan((out,), "moe_combine_recv")
    args = dict(expert_y=b.expert_x, stride_ye=0, stride_yr=0, topk_weights=b.dweights,
                stride_wt=0, stride_wk=0, out=Live(0), num_tokens=T, weights=b.weights,
                num_weight_programs=0, fp=_call(ep, _kernels(ep)[1], at_dispatch),
                **_combine_constexprs(ep, 0))
    # the receivers watch for the other call where the weights came with dispatch
    # (high_throughput.py ht_combine_recv, combine.py combine_recv)
    _launch(ep, plan, _kernels(ep)[1], B.RECV, 0, _programs(ep, T), args,
            WEIGHTS_AT_DISPATCH=at_dispatch)
    return plan
