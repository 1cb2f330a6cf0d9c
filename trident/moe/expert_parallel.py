"""ExpertParallel: MoE dispatch and combine over the symmetric heap (the host side).

    ep = td.ExpertParallel(ctx, num_experts, experts_per_token, hidden_dim, max_num_tokens)
    d = ep.dispatch(x, topk_idx)              # d.expert_x [L, cap, H], d.expert_num_tokens [L]
    y = ep.combine(expert_y, d, topk_weights) # [T, H]
    d = ep.dispatch(x, topk_idx, fp8=True)    # e4m3 d.expert_x, d.expert_x_scale [L, cap, H/128]

Rank r owns experts [r*L, (r+1)*L). Each call is one kernel launch (send and receive
halves in one grid) through a launch plan (plans.py): the first call with a signature
checks the inputs and packs the launch, later calls only look the plan up and launch,
with no host synchronisation. Expert ids are checked on the device (routing.py): bad ones
are dropped, and the first is raised as a ValueError at the next ctx.sync() or
ctx.barrier() (at once in debug mode). Pass wait=False to get the send half only; the
handle's .wait() launches the receive half, so other GPU work can run in between while
the data is in flight.

Lifetime: expert_x and expert_num_tokens are this object's buffers, overwritten by the
next dispatch; one dispatch/combine round may be in flight per ExpertParallel (use one
object per micro-batch to overlap two). Every rank must make the same calls in the same
order (T may differ). A call that differs on a rank (another ExpertParallel shape or path,
fp8, weights at dispatch on some ranks only), a peer that never comes or one that failed
raises CallMismatch, CommTimeout or PeerFailed at the next call, and the call's outputs
are poisoned (NaN rows, counts of -1: buffers.py "Calls").
"""
from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass

import torch

from ..runtime.context import Context
from ..runtime.plans import live_key, tensor_key
from . import buffers as B
from . import plans

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_IDS = itertools.count()      # names an ExpertParallel in plan keys (id() can be reused)
# the ExpertParallels of this process by name (ep.name), for the torch custom ops
_NAMED: "weakref.WeakValueDictionary[str, ExpertParallel]" = weakref.WeakValueDictionary()


def named(name: str) -> "ExpertParallel | None":
    """The ExpertParallel named `name` in this process (ep.name), or None."""
    return _NAMED.get(name)


@dataclass(slots=True)
class Dispatched:
    """What dispatch returns: the experts' inputs, and what combine needs to route back."""
    expert_x: torch.Tensor           # [L, cap, H]: rows [0, expert_num_tokens[e]) are valid
                                     # (float8_e4m3fn after dispatch(..., fp8=True))
    expert_num_tokens: torch.Tensor  # [L] int32, on the device
    num_tokens: int                  # T of this rank's dispatch
    has_weights: bool = False        # topk_weights travelled with the tokens
    _seq: int = 0
    expert_x_scale: torch.Tensor | None = None   # fp8: [L, cap, H/128] fp32, column-major
                                     # in its last two dims (DeepEP's layout); a row's values
                                     # are expert_x[e, i, j] * expert_x_scale[e, i, j // 128]
    _owner: int = -1                 # the _id of the ExpertParallel whose dispatch made it
    _receiving: bool = False         # dispatch(wait=False): its receive half is not queued
                                     # yet (PendingDispatch.wait() clears it)


class PendingDispatch:
    """The send half of a dispatch is queued; .wait() queues the receive half."""

    def __init__(self, ep: "ExpertParallel", result: Dispatched):
        self._ep, self._result, self._done = ep, result, False

    @property
    def result(self) -> Dispatched:
        """The Dispatched whose buffers the receive half fills: its tensors may be held
        now (DeepEP's hook mode returns them before the hook) and read after .wait()."""
        return self._result

    def wait(self) -> Dispatched:
        if not self._done:
            self._ep._dispatch_recv(self._result.expert_x_scale is not None,
                                    self._result.has_weights)
            self._done = True
            self._result._receiving = False      # combine may take it now
        return self._result


class PendingCombine:
    """The send half of a combine is queued; .wait() queues the receive half, returns y.
    `recv`: what the receive half needs of its send half (ExpertParallel: whether the
    weights came with dispatch, in the call's fingerprint)."""

    def __init__(self, ep: "ExpertParallel", out: torch.Tensor, *recv):
        self._ep, self._out, self._recv, self._done = ep, out, recv, False

    def wait(self) -> torch.Tensor:
        if not self._done:
            self._ep._combine_recv(self._out, *self._recv)
            self._done = True
        return self._out


def _check_positive(name: str, v, also: str = "") -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"ExpertParallel: {name} must be a positive int{also}, got {v!r}")


def check_args(world: int, num_experts, experts_per_token, hidden_dim, max_num_tokens,
               dtype) -> None:
    """The constructor's checks (shared with trident.nodes' ExpertParallelAcrossNodes)."""
    for name, v in (("num_experts", num_experts), ("experts_per_token", experts_per_token),
                    ("hidden_dim", hidden_dim), ("max_num_tokens", max_num_tokens)):
        _check_positive(name, v)
    if num_experts % world:
        raise ValueError(f"ExpertParallel: num_experts ({num_experts}) must be a multiple "
                         f"of the world size ({world}): rank r owns experts [r*L, (r+1)*L)")
    if experts_per_token > num_experts:
        raise ValueError(f"ExpertParallel: experts_per_token ({experts_per_token}) exceeds "
                         f"num_experts ({num_experts}); experts of a token must differ")
    if dtype not in _DTYPES:
        raise TypeError(f"ExpertParallel: dtype must be one of {_DTYPES}, got {dtype}")


def program_cap(ctx, num_sms) -> int:
    """The most programs of a launch (half): two per SM of the rank's share of the GPU
    (all ranks' programs resident at once), or of `num_sms` of them; on the CPU emulation
    3 (few programs, still more than one), or 2 * num_sms if fewer."""
    if num_sms is not None:
        _check_positive("num_sms", num_sms, " or None")
    if ctx.backend != "cuda":
        return 3 if num_sms is None else min(3, 2 * num_sms)
    share = ctx.usable_sms
    if num_sms is not None and num_sms > share:
        raise ValueError(f"ExpertParallel: num_sms={num_sms}, but this rank has {share} SMs "
                         f"(its share of the GPU)")
    return 2 * (share if num_sms is None else num_sms)


def agree_args(ctx, **fields) -> None:
    """The constructor's arguments that the ranks' kernels share (and what they resolved to
    on this rank: the program cap, the path) are the same on every rank, checked before
    anything is allocated: else every rank raises ValueError naming each field that
    differs and every rank's value (instead of a heap mismatch of buffer shapes, or a call
    mismatch at the first dispatch). validate and allow_minus_one are each rank's own."""
    mine = tuple((k, str(v)) for k, v in fields.items())
    with ctx.building("ExpertParallel"):
        _, everyone = ctx.host_exchange("ExpertParallel", detail=mine)
    if everyone is None:
        return
    differ = [i for i in range(len(mine)) if len({theirs[i] for theirs in everyone}) > 1]
    said = "; ".join(f"{mine[i][0]}: " + ", ".join(f"rank {r} {theirs[i][1]}"
                                                    for r, theirs in enumerate(everyone))
                     for i in differ)
    hint = {"programs": " (programs: twice num_sms; with num_sms=None, each rank's share of "
                        "the GPU: pass the same num_sms)",
            "high_throughput": " (high_throughput=None: max_num_tokens against each rank's "
                               "TRIDENT_MOE_HT_MIN_TOKENS)"}
    raise ValueError(f"ExpertParallel: the ranks made it with different arguments ({said}); "
                     f"every rank must pass the same"
                     + "".join(hint.get(mine[i][0], "") for i in differ))


class _NamedByContext(type):
    """ExpertParallel(ctx, ...) makes the class that the context names in its attribute
    `expert_parallel_class`, where it has one: a trident.WorldContext names the two-stage
    route across nodes (trident/nodes/expert_parallel.py). A Context of one node names
    none: this module's ExpertParallel. So user code is the same on one node and across
    nodes, and this package knows nothing of nodes (trident.nodes imports it, not back)."""

    def __call__(cls, ctx, *args, **kwargs):
        named = getattr(ctx, "expert_parallel_class", None) if cls is ExpertParallel else None
        return type.__call__(named or cls, ctx, *args, **kwargs)


class ExpertParallel(metaclass=_NamedByContext):
    """Expert-parallel dispatch/combine for `num_experts` experts spread over the ranks.

    On a context across nodes (trident.WorldContext), ExpertParallel(ctx, ...) makes the
    context's own kind, ctx.expert_parallel_class (trident/nodes/expert_parallel.py): the
    same API and results, routed through one rank per node.

    Expert ids out of range or repeated within a token are always dropped by the kernel
    (never written out of bounds). validate=True (default; here or per call) also records
    the first one in the rank's control block, raised as ValueError at the next
    ctx.sync() / ctx.barrier(); it costs no host synchronisation. Shapes, dtypes, strides
    and T <= max_num_tokens are checked once per signature, when the plan is built.

    high_throughput: the chunk-pipelined kernels for prefill-size batches
    (high_throughput.py) instead of the low-latency ones; None (default) picks them when
    max_num_tokens >= ctx.options.moe_ht_min_tokens (TRIDENT_MOE_HT_MIN_TOKENS, 1024). Same results
    and API either way; keep one object per regime (decode, prefill) as with DeepEP.

    allow_minus_one=True: an id of -1 selects no expert (DeepEP's convention): dropped
    like any bad id, but never recorded as an error (other bad ids still are).

    num_sms: the SMs its kernels are sized for, two programs each (DeepEP's num_sms: fewer
    leaves the rest of the GPU to work that overlaps the transfer, at a lower byte rate);
    None (default): the rank's share of the GPU (ctx.usable_sms). At most that share; the
    same on every rank (the low-latency path's fingerprint holds it). `sms` says what the
    launches use. On the CPU emulation it caps the programs alike (at most 3 there).
    """

    def __init__(self, ctx, num_experts: int, experts_per_token: int, hidden_dim: int,
                 max_num_tokens: int, dtype: torch.dtype = torch.bfloat16,
                 validate: bool = True, high_throughput: bool | None = None,
                 allow_minus_one: bool = False, num_sms: int | None = None):
        if not isinstance(ctx, Context):
            raise TypeError(f"ExpertParallel: ctx must be a trident context (td.init(), or the "
                            f"ctx that td.launch passes), got {type(ctx).__name__}")
        try:
            check_args(ctx.world_size, num_experts, experts_per_token, hidden_dim,
                       max_num_tokens, dtype)
            max_programs = program_cap(ctx, num_sms)
        except (TypeError, ValueError) as exc:
            # a rank that raises alone here never makes the allocations and the barrier
            # below: its peers' barrier then stops naming this error instead of timing out
            raise ctx.fail_call("ExpertParallel", exc) from None
        world = ctx.world_size
        self.ctx = ctx
        self.num_experts, self.experts_per_token = num_experts, experts_per_token
        self.hidden_dim, self.max_num_tokens, self.dtype = hidden_dim, max_num_tokens, dtype
        self.num_local_experts = num_experts // world
        self.validate = bool(validate)
        self.allow_minus_one = bool(allow_minus_one)
        # the kernels of high_throughput.py (chunk-pipelined, for prefill-size batches) or
        # of dispatch.py/combine.py (low latency); per object, so the same on every rank
        self.high_throughput = (max_num_tokens >= ctx.options.moe_ht_min_tokens
                                if high_throughput is None else bool(high_throughput))
        agree_args(ctx, num_experts=num_experts, experts_per_token=experts_per_token,
                   hidden_dim=hidden_dim, max_num_tokens=max_num_tokens, dtype=dtype,
                   high_throughput=self.high_throughput, programs=max_programs)
        self._id = next(_IDS)
        # how trident::moe_dispatch/combine find it (trident/torch/ops/moe.py): its context's
        # name, its number in this process and what the ops' fakes read (local experts,
        # max_num_tokens -- the capacity is max_num_tokens * world -- and the hidden size)
        self.name = (f"{ctx.name}/ep{self._id}:local_experts{self.num_local_experts}"
                     f":max_tokens{self.max_num_tokens}:hidden{self.hidden_dim}")
        _NAMED[self.name] = self
        history = ctx.allocator.mark()
        self.buf = B.Buffers(ctx, self.num_local_experts, experts_per_token, hidden_dim,
                             max_num_tokens, dtype)
        self.capacity = self.buf.cap
        self.block_h = B.block_h(hidden_dim)
        self.max_programs = max_programs
        self.num_warps = 4 if ctx.backend == "cuda" else 1
        self.sms = -(-max_programs // 2)          # what the launches are sized for
        self._seq = 0
        self._result: Dispatched | None = None
        try:
            # every rank's flags are zero before anyone signals. A barrier of this call
            # (ctx.building): a peer that refused its arguments (fail_call above) makes it
            # raise PeerFailed naming that at once, whatever that peer calls next
            with ctx.building("ExpertParallel"):
                ctx.barrier()
        except BaseException:
            # a peer did not make this object (its arguments were refused there): hand
            # back what this rank allocated, as if it never had (the peer made no requests),
            # so that the heaps and their histories agree: ctx.reset() and close() work
            self.buf.free(ctx)
            ctx.allocator.rewind(history)
            self.buf = None
            raise
        ctx.register_reset(self)

    @staticmethod
    def heap_bytes(world_size: int, experts_per_token: int, hidden_dim: int,
                   max_num_tokens: int, dtype: torch.dtype = torch.bfloat16) -> int:
        """Symmetric-heap bytes an ExpertParallel of this shape allocates (size the heap)."""
        return B.Buffers.heap_bytes(world_size, experts_per_token, hidden_dim, max_num_tokens,
                                    dtype) + 4096

    # ------------------------------------------------------------------ plans
    def _plan(self, key, build, *args):
        """The run of `key`'s plan (trident/runtime/plans.py), built by `build(self, *args)` if
        new. dispatch and combine, the warm path, look their key up themselves (no frame of
        this and plans.cached: ~0.3 us of a host-bound call)."""
        return plans.cached(self.ctx, key, build, self, *args)

    def programs(self, work: int) -> int:
        """Programs of a launch (half) with `work` items: at least 1, at most max_programs."""
        return max(1, min(work, self.max_programs))

    # ------------------------------------------------------------------ dispatch
    def reset(self) -> None:
        """Epochs, flags and counters back to zero (ctx.reset() calls this on every rank
        after a failure); a Dispatched from before the reset can no longer be combined.
        Nothing once closed (the object may outlive close(): ctx.reset() still finds it)."""
        if self.buf is None:
            return
        self.buf.reset()
        self._seq += 1

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, wait: bool = True,
                 validate: bool | None = None, topk_weights: torch.Tensor | None = None,
                 fp8: bool = False):
        """Send every token to the ranks owning its experts; returns a Dispatched (or, with
        wait=False, a PendingDispatch whose .wait() returns it).

        topk_weights [T, k] float32, optional: send the weights with the tokens (32 bytes
        per token and rank); combine may then be called without them, and its send half
        waits for nothing.

        fp8=True: the send kernel quantises each token to float8_e4m3fn with one fp32
        scale per 128 channels (the DeepEP/pplx layout; hidden_dim must be a multiple of
        128) and sends that, about half the bytes of bf16. Then d.expert_x is
        [L, cap, H] float8_e4m3fn and d.expert_x_scale [L, cap, H/128] fp32 (column-major
        in its last two dims, as DeepEP's: stride(1) == 1), ready for an fp8 grouped GEMM; trident.moe.fp8.dequantize(d.expert_x, d.expert_x_scale) gives
        the values, equal to trident.moe.fp8.quantize of the sender's token, dequantised.
        combine is unchanged (expert_y in this object's dtype). Both outputs are this
        object's buffers, separate from the non-fp8 ones, overwritten by the next fp8
        dispatch.
        """
        ctx = self.ctx
        has_w = topk_weights is not None
        check = self.validate if validate is None else bool(validate)
        key = ("moe_dispatch", self._id, tensor_key(x), tensor_key(topk_idx),
               tensor_key(topk_weights) if has_w else None, wait, check, ctx.capturing(),
               fp8)
        (ctx.plans.get(key) or plans.new_plan(ctx, key, plans.dispatch, (
            self, x, topk_idx, topk_weights, wait, check, bool(fp8)))).run()
        self._seq += 1
        b = self.buf
        if fp8:
            self._result = Dispatched(b.expert_x_fp8, b.expert_num_tokens, x.shape[0], has_w,
                                      self._seq, b.expert_x_scale, self._id, not wait)
        else:
            self._result = Dispatched(b.expert_x, b.expert_num_tokens, x.shape[0], has_w,
                                      self._seq, None, self._id, not wait)
        if not wait:
            # checked in debug mode after the receive half: the send half never waits, and a
            # bad id raised between the halves would leave this rank's receive epoch behind
            return PendingDispatch(self, self._result)
        ctx.after_op()
        return self._result

    def _dispatch_recv(self, fp8: bool = False, has_weights: bool = False) -> None:
        ctx = self.ctx
        self._plan(("moe_dispatch_recv", self._id, ctx.capturing(), fp8, has_weights),
                   plans.dispatch_recv, fp8, has_weights)()
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
        # checked before any plan's build: fail_call hands the error to the peers, whose
        # combine then stops at once naming it instead of waiting for this rank
        if not isinstance(d, Dispatched):
            raise self.ctx.fail_call("moe_combine", TypeError(
                f"combine: d must be what dispatch returned (a Dispatched; call .wait() on a "
                f"PendingDispatch), got {type(d).__name__}"))
        if d._owner != self._id:
            raise self.ctx.fail_call("moe_combine", ValueError(
                f"combine: d was returned by the dispatch of another ExpertParallel "
                f"(ep{d._owner}), not of this one ({self.name}); combine it with the "
                f"ExpertParallel that dispatched it (its buffers hold the tokens)"))
        if d._receiving:
            raise self.ctx.fail_call("moe_combine", RuntimeError(
                "combine: d is the result of a dispatch(wait=False) whose receive half has "
                "not run: its expert_x is not received yet. Call .wait() on the "
                "PendingDispatch first (d = pending.wait()), then combine"))
        if d._seq != self._seq:
            raise self.ctx.fail_call("moe_combine", ValueError(
                "combine: d is from an earlier dispatch; its buffers have been reused since. "
                "Combine the latest dispatch (one round in flight per ExpertParallel)"))
        ctx, T = self.ctx, d.num_tokens
        key = ("moe_combine", self._id, tensor_key(expert_y),
               None if topk_weights is None else tensor_key(topk_weights), T, d.has_weights,
               None if out is None else live_key(out), wait, ctx.capturing())
        if out is None:
            out = torch.empty(T, self.hidden_dim, dtype=self.dtype, device=ctx.device)
        (ctx.plans.get(key) or plans.new_plan(ctx, key, plans.combine, (
            self, expert_y, d, topk_weights, out, wait))).run((out,))
        ctx.after_op()
        # the receive half's fingerprint is its send half's (plans.combine_recv)
        return out if wait else PendingCombine(self, out, topk_weights is None)

    def _combine_recv(self, out: torch.Tensor, at_dispatch: bool) -> None:
        ctx = self.ctx
        T = out.shape[0]
        self._plan(("moe_combine_recv", self._id, T, ctx.capturing(), at_dispatch),
                   plans.combine_recv, T, out, at_dispatch)((out,))
        ctx.after_op()

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
