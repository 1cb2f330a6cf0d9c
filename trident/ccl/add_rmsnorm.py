"""Fused all-reduce + residual add + RMSNorm: the step after every row-parallel linear of
a transformer layer (ctx.all_reduce_add_rmsnorm).

Per row of x [rows, hidden] (any leading dimensions; the last is `hidden`):
    s        = sum over ranks of x                      (fp32, in rank order 0..world-1)
    residual = residual + s                             (in place: the next residual)
    out      = residual * rsqrt(mean(residual^2) + eps) * weight

One kernel launch ("one_shot", for decode-sized calls), one-shot style as
all_reduce/one_shot.py: every rank pushes its rows of x into a slot of every peer's
scratch (heap, half `epoch % 2`, see device.py "Scratch halves"), one DATA handshake per
program, then each rank reduces the slots locally in rank order, adds its residual,
stores the new residual, and normalises from the stored (rounded) residual. Every rank
sums the same values in the same order, so with the same residual everywhere (the
replicated residual stream of tensor parallelism) every rank gets bit-identical residual
and out. Only the scratch has to be on the heap: x, residual, weight and out may be any
tensors (plain ones need no staging copy, and heap tensors at different offsets on
different ranks need no offset exchange). Flags carry the launch epoch (device.py): no
memsets, nothing read on the host, CUDA-graph capturable.

A program owns whole rows (programs = min(rows, 128) on GPUs); a row is processed in
chunks of BLOCK elements: pass 1 reduces, adds and stores the residual and sums the
squares, pass 2 (after a barrier of the program) re-reads the residual rows it just wrote
and writes out. Rounding: s stays fp32; residual is rounded to its dtype once; the norm
is computed in fp32 from the rounded residual; out is rounded once.

"lamport": the same computation, rounding and rank order, with the exchange done by the
Lamport protocol (ccl/lamport.py, as all_reduce/lamport.py): every program stores its rows'
chunks as words (element i of x at offset i of my slot of every peer's buffer of this
round) and its head, then receives chunk by chunk (`lamport.receive`: the data is its own
ready flag; what was read is cleared at once) and adds and normalises as above. It shares
the Lamport workspace and round counter of every Lamport kernel of the context. A -0.0 of
x travels as +0.0 (and every rank reduces its own x so), so the residual of an all-zero
sum may differ in the sign of a zero from one_shot's, never across ranks. At most
`lamport.capacity` bytes of x per rank (1 MiB with the default heap; ValueError above).
It is expected to win at decode sizes (a few rows, latency-bound), where it saves
one_shot's release fence and flag round trip per program -- not yet measured on GPUs, so
"auto" does not pick it: name it (algorithm="lamport").

Algorithms: "one_shot" (above), "lamport" (above), "unfused" (trident's all_reduce of a
copy of x, then the add and the norm in torch: several launches, any size), "nccl"
(torch.distributed all_reduce, then torch; not graphable; not where ranks share a GPU, see
ccl/nccl.py). "auto" picks one_shot up to ONE_SHOT_MAX_BYTES of x per rank (the one-shot
scratch is 2 * world * that), unfused above (whose all_reduce is the selector's, never
NCCL where NCCL cannot run).
"""
from __future__ import annotations

import weakref

import torch
import triton
import triton.language as tl
import torch.distributed as dist

import trident.language as tdl
from trident.trace import device as trd, kernel_args, tags

from . import common, lamport as proto, nccl
from .device import (DATA, OP_ADD_RMSNORM, SUM, begin_epoch, exchange, fingerprint, poison,
                     reduce_slots, scratch_half)
from ..runtime.graph_pools import outside_graph_pools
from ..runtime.compiled import STANDINS, is_compiling
from ..runtime.plans import Live, Plan, tensor_key

NAME = "all_reduce_add_rmsnorm"
ALGORITHMS = ("one_shot", "lamport", "unfused", "nccl")
ONE_SHOT_MAX_BYTES = 1 << 20        # x per rank; above: "unfused"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
GPU_MAX_BLOCK = 4096                # elements of a row per chunk (8 warps: 16 per thread)
CPU_MAX_BLOCK = 256


@triton.jit
def _add_residual(residual, offs, mask, s, dst):
    """dst[offs] = residual[offs] + s (fp32), rounded once to dst's dtype and stored (dst is
    residual for the in-place add); returns the rounded values' squares (0 outside
    `mask`), for the norm."""
    r = (tl.load(residual + offs, mask=mask).to(tl.float32) + s).to(dst.dtype.element_ty)
    tl.store(dst + offs, r, mask=mask)
    rf = r.to(tl.float32)
    return tl.where(mask, rf * rf, 0.0)


@triton.jit
def _norm_row(residual, weight, out, base, hidden, squares, eps, BLOCK: tl.constexpr):
    """out[row] = residual[row] * rsqrt(mean of squares + eps) * weight, from the residual
    row this program has just stored (starting at `base`)."""
    rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / hidden + eps)
    tl.debug_barrier()               # the residual stores before the loads below
    for c in range(0, hidden, BLOCK):
        cols = c + tl.arange(0, BLOCK)
        mask = cols < hidden
        rf = tl.load(residual + base + cols, mask=mask).to(tl.float32)
        w = tl.load(weight + cols, mask=mask).to(tl.float32)
        tl.store(out + base + cols, (rf * rstd * w).to(out.dtype.element_ty), mask=mask)


@triton.jit
def _add_rmsnorm_kernel(x, residual, weight, out, scratch, flags, sync, ctrl, heap_bases,
                        trace_buf, rank, world_size, rows, hidden, stride, half, eps, fp,
                        BLOCK: tl.constexpr, TRACE: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = begin_epoch(sync)
    slots = scratch_half(scratch, epoch, half)
    t0 = trd.begin(TRACE)
    for row in range(pid, rows, nprog):
        base = row * hidden
        for c in range(0, hidden, BLOCK):
            offs = base + c + tl.arange(0, BLOCK)
            mask = offs < base + hidden
            v = tl.load(x + offs, mask=mask)
            for i in range(1, world_size):
                tdl.store(slots + rank * stride + offs, v, rank, (rank + i) % world_size,
                          heap_bases, mask=mask)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
    ok = exchange(flags, DATA, epoch, ctrl, rank, world_size, heap_bases,
                  OP_ADD_RMSNORM, fp, trace_buf, TRACE)
    t0 = trd.begin(TRACE)
    for row in range(pid, rows, nprog):
        base = row * hidden
        squares = tl.zeros([BLOCK], dtype=tl.float32)
        for c in range(0, hidden, BLOCK):
            offs = base + c + tl.arange(0, BLOCK)
            mask = offs < base + hidden
            # a failed exchange leaves NaN in the residual and the output (poison)
            s = poison(reduce_slots(x, slots, stride, offs, mask, rank, world_size, SUM), ok)
            squares += _add_residual(residual, offs, mask, s, residual)
        _norm_row(residual, weight, out, base, hidden, squares, eps, BLOCK)
    trd.end(trace_buf, t0, tags.REDUCE, rank, TRACE)


@triton.jit
def _lamport_kernel(x, residual, weight, out, data, heads, lsync, fsync, ctrl, heap_bases,
                    trace_buf, rank, rows, hidden, slot, eps, fp, WORLD: tl.constexpr,
                    BLOCK: tl.constexpr, TRACE: tl.constexpr, PDL: tl.constexpr):
    # ccl/lamport.py: this round's buffer; element i of x goes to offset i of my slot
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    t0 = trd.begin(TRACE)
    epoch, buf, base, expect = proto.open_round(data, lsync, slot, fp, WORLD, PDL)
    for row in range(pid, rows, nprog):
        start = row * hidden
        for c in range(0, hidden, BLOCK):
            offs = start + c + tl.arange(0, BLOCK)
            mask = offs < start + hidden
            words = proto.to_words(tl.load(x + offs, mask=mask))
            proto.send(base + rank * slot, words, offs, mask, rank, heap_bases, WORLD)
    heads_row, ok, t0 = proto.sent(heads, buf, expect, rank, heap_bases, trace_buf, t0, WORLD,
                                   TRACE)
    for row in range(pid, rows, nprog):
        start = row * hidden
        squares = tl.zeros([BLOCK], dtype=tl.float32)
        for c in range(0, hidden, BLOCK):
            offs = start + c + tl.arange(0, BLOCK)
            mask = offs < start + hidden
            # every rank reduces what travels (-0.0 as +0.0): the same values everywhere
            local = proto.canonical(tl.load(x + offs, mask=mask))
            s, ok = proto.receive(base, slot, heads_row, local, offs, mask, expect, ok, ctrl,
                                  fsync, rank, heap_bases, SUM, WORLD, OP_ADD_RMSNORM)
            # a failed wait leaves NaN in the residual and the output (poison), from this
            # chunk on (the chunks before it came whole, in a call of this fingerprint)
            squares += _add_residual(residual, offs, mask, poison(s, ok), residual)
        _norm_row(residual, weight, out, start, hidden, squares, eps, BLOCK)
    proto.clear_heads(heads_row, rank, WORLD)
    proto.end(lsync, epoch)
    trd.end(trace_buf, t0, tags.REDUCE, rank, TRACE)


# ---------------------------------------------------------------------------- host
def all_reduce_add_rmsnorm(ctx, x, residual, weight, eps: float = 1e-6, out=None,
                           algorithm: str = "auto", block=None, programs=None):
    """residual += all_reduce_sum(x) (in place); returns out = rmsnorm(residual) * weight
    (a new tensor shaped like x, or `out`). See the module docstring."""
    if is_compiling():             # torch.compile traces its stand-in (runtime/compiled.py)
        return STANDINS["all_reduce_add_rmsnorm"](ctx, x, residual, weight, eps, out, algorithm,
                                                  block, programs)
    fresh = out is None
    key = (NAME, tensor_key(x), tensor_key(residual), tensor_key(weight),
           None if fresh else tensor_key(out), eps, algorithm, block, programs, ctx.capturing())
    if fresh and isinstance(x, torch.Tensor):
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    plan = ctx.plans.get(key)
    if plan is None or ctx.debug:
        from . import _run
        _run(ctx, key, _plan, (x, residual, weight, out), fresh, eps, algorithm, block,
             programs, key[-1], found=plan)
    else:
        plan.run((x, residual, weight, out))
    return out


def _check(ctx, x, residual, weight, out, eps):
    for t, name in ((x, "x"), (residual, "residual"), (weight, "weight"), (out, "out")):
        common.check_tensor(ctx, t, f"{NAME}: {name}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{NAME}: {name} must be bfloat16, float16 or float32, got {t.dtype}")
    if x.dim() == 0:
        raise ValueError(f"{NAME}: x must have at least one dimension (hidden), got a scalar")
    for t, name in ((residual, "residual"), (out, "out")):
        if tuple(t.shape) != tuple(x.shape):
            raise ValueError(f"{NAME}: {name} must have x's shape {list(x.shape)}, got "
                             f"{list(t.shape)}")
        if t.dtype != x.dtype:
            raise TypeError(f"{NAME}: {name} must have x's dtype {x.dtype}, got {t.dtype}")
    if tuple(weight.shape) != (x.shape[-1],):
        raise ValueError(f"{NAME}: weight must have shape [{x.shape[-1]}] (x's last "
                         f"dimension), got {list(weight.shape)}")
    if out.numel() and out.data_ptr() in (residual.data_ptr(), weight.data_ptr()):
        raise ValueError(f"{NAME}: out must not be residual or weight")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"{NAME}: eps must be a non-negative number, got {eps!r}")


def _name(ctx, algorithm, nbytes: int) -> str:
    if algorithm is None or algorithm == "auto":
        return "one_shot" if nbytes <= ONE_SHOT_MAX_BYTES else "unfused"
    if algorithm not in ALGORITHMS:
        raise ValueError(f"{NAME}: unknown algorithm {algorithm!r}; choose one of "
                         f"{['auto', *ALGORITHMS]}")
    if algorithm == "nccl":                 # not where ranks share a GPU
        nccl.check_available(ctx, f"{NAME}: algorithm 'nccl'",
                             ["auto", *(a for a in ALGORITHMS if a != "nccl")])
    return algorithm


def torch_add_rmsnorm(s, residual, weight, out, eps: float) -> None:
    """residual += s; out = rmsnorm(residual) * weight, in torch, rounded as the kernel."""
    r = (residual.float() + s.float()).to(residual.dtype)
    residual.copy_(r)
    rf = r.float()
    out.copy_((rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + eps)
               * weight.float()).to(out.dtype))


_unfused_sums: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _unfused_sum(ctx, x) -> torch.Tensor:
    """The unfused path's sum buffer, kept by its plans: one per context, shape and dtype,
    made at the first (eager) call where no CUDA-graph pool takes it
    (trident/runtime/graph_pools.py) and shared with the plan a later capture builds for the
    same sizes (a capture may not allocate it: outside_graph_pools refuses). The plans using
    it run in stream order. Keyed by the context's plan cache, which a capture twin's
    build sees through its wrapper (ops/_common._AsCaptured) as the same object."""
    bufs = _unfused_sums.setdefault(ctx.plans, {})
    key = (tuple(x.shape), x.dtype)
    if key not in bufs:
        bufs[key] = outside_graph_pools(
            ctx.device, "all_reduce_add_rmsnorm's unfused sum",
            lambda: torch.empty(x.shape, dtype=x.dtype, device=ctx.device))
    return bufs[key]


def _plan(ctx, x, residual, weight, out, fresh, eps, algorithm, block, programs, graph) -> Plan:
    _check(ctx, x, residual, weight, out, eps)
    hidden = x.shape[-1]
    rows = x.numel() // hidden if hidden else 0
    name = _name(ctx, algorithm, x.numel() * x.element_size())
    plan = Plan((x, residual, weight, out), name)
    plan.out_shape = tuple(x.shape)
    eps = float(eps)
    if name in ("one_shot", "lamport"):     # their launch checks these; so does an empty x
        common.check_launch(block, programs)
    if name == "lamport":
        _check_lamport(ctx, x)
    if rows == 0 or hidden == 0:
        return plan
    if name == "nccl":
        def step(ts):
            s = ts[0].clone()
            dist.all_reduce(s, group=ctx.group)
            torch_add_rmsnorm(s, ts[1], ts[2], ts[3], eps)
        plan.add(step, graphable=False)
    elif name == "unfused":
        s = _unfused_sum(ctx, x)

        def step(ts):
            s.copy_(ts[0])
            ctx.all_reduce(s)
            torch_add_rmsnorm(s, ts[1], ts[2], ts[3], eps)
        plan.add(step)
    elif name == "lamport":
        _lamport(ctx, plan, rows, hidden, x, eps, fresh, block, programs)
    else:
        _one_shot(ctx, plan, rows, hidden, x, eps, fresh, block, programs)
    return plan


def launch_size(ctx, rows: int, hidden: int, block=None, programs=None) -> tuple[int, int, int]:
    """(BLOCK elements of a row per chunk, programs, warps)."""
    gpu = ctx.backend == "cuda"
    if block is None:
        block = min(max(16, triton.next_power_of_2(hidden)), GPU_MAX_BLOCK if gpu else CPU_MAX_BLOCK)
    if block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    _, grid = common.launch_size(ctx, rows, 1, 1, programs)
    warps = (8 if block >= 2048 else 4) if gpu else 4
    return block, grid, warps


def _one_shot(ctx, plan, rows, hidden, x, eps, fresh, block, programs):
    n = rows * hidden
    stride = common.round_up(n)
    slots = common.scratch(ctx, 2 * ctx.world_size * stride * x.element_size(), x.dtype)
    st = common.state(ctx)
    block, grid, warps = launch_size(ctx, rows, hidden, block, programs)
    trace_buf, trace = kernel_args(ctx)
    out = Live(3) if fresh else plan.tensors[3]
    options = {"num_warps": warps} if ctx.backend == "cuda" else {}
    plan.launch(
        _add_rmsnorm_kernel, (grid,), x, plan.tensors[1], plan.tensors[2], out, slots,
        st.flags, st.sync, ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank, ctx.world_size,
        rows, hidden, stride, slots.numel() // 2, eps,
        fingerprint(_add_rmsnorm_kernel, rows, hidden, str(x.dtype), eps), BLOCK=block, TRACE=trace, **options)


def _check_lamport(ctx, x) -> None:
    """ValueError unless x fits a Lamport slot (the same on every rank: the agreed heap)."""
    cap = proto.slot_bytes(ctx)
    nbytes = x.numel() * x.element_size()
    if nbytes > cap:
        raise ValueError(f"{NAME}: algorithm 'lamport' takes at most {cap} bytes of x per rank "
                         f"with this heap ({ctx.heap_size} bytes), got {nbytes}; use "
                         f"'one_shot' or 'unfused'")


def _lamport(ctx, plan, rows, hidden, x, eps, fresh, block, programs):
    """The kernel's launch, on the context's Lamport buffers (lamport.workspace)."""
    ws = proto.workspace(ctx)
    data, slot = ws.slots(x.dtype)
    block, grid, warps = launch_size(ctx, rows, hidden, block, programs)
    trace_buf, trace = kernel_args(ctx)
    out = Live(3) if fresh else plan.tensors[3]
    options = {"num_warps": warps} if ctx.backend == "cuda" else {}
    plan.launch(
        _lamport_kernel, (grid,), x, plan.tensors[1], plan.tensors[2], out, data, ws.heads,
        ws.sync, common.state(ctx).sync, ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank, rows,
        hidden, slot, eps, fingerprint(_lamport_kernel, rows, hidden, str(x.dtype), eps),
        WORLD=ctx.world_size, BLOCK=block, TRACE=trace, **options, **proto.pdl(ctx))
