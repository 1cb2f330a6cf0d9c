"""matmul_all_reduce_add_rmsnorm: row-parallel linear -> all-reduce -> residual add ->
RMSNorm, the whole communication of a tensor-parallel decode layer (attention-out or down
projection, then the next block's norm):

    res = all_reduce(a @ w.T) + bias + residual    (bias added once)
    out = rmsnorm(res) * norm_weight
    returns (out, res)

res is a new tensor, or `residual_out` if given: residual_out=residual adds in place (as
ctx.all_reduce_add_rmsnorm does), which saves an allocation per call.

a: [M, K_local] (each rank's K may differ), w: [N, K_local] (nn.Linear layout), residual:
[M, N] in a's dtype, norm_weight: [N], as ctx.all_reduce_add_rmsnorm after
ctx.matmul_all_reduce. Every rank ends with bitwise the same res and out (with the same
residual on every rank, as the replicated residual stream of TP has it).

Schedules:
    "fused"       one kernel: matmul_all_reduce's epilogue kernel with the Lamport
                  exchange and its NORM end (epilogue_lamport.py): each GEMM program
                  pushes its tile's partial to the peers as Lamport words, sums the tiles'
                  as they arrive, adds bias and residual; the last tile of a row block to
                  arrive normalises its rows. M <= MAX_M and M x N in a Lamport slot (1 MiB
                  of a 1 GiB heap): `why_not`.
    "sequential"  matmul_all_reduce (its schedule: `matmul_schedule=`, default "auto";
                  "plain" is cuBLAS + NCCL) into a buffer, then the add and the norm in
                  torch. Any size.
    "auto"        "fused" where it fits, else "sequential". Not measured on GPUs yet: the
                  one kernel is what the op is for (issue 39), so auto takes it wherever
                  it can run.
Options: config (fused: tile overrides, as the epilogue schedule's), matmul_schedule
(sequential). Under "auto" an option of the other schedule is dropped.
"""
from __future__ import annotations

import torch

from ..runtime import plans
from ..ccl import common as ccl_common, lamport
from ..ccl.add_rmsnorm import _unfused_sum, torch_add_rmsnorm
from ..runtime.compiled import STANDINS, is_compiling
from ..runtime.plans import Live, Plan, tensor_key
from . import _common, epilogue_lamport, schedules
from ._common import _AsCaptured, _options_key, check_inputs, check_matrix, schedule_plan
from .epilogue import row_parallel
from .gemm import addresses_only

NAME = "matmul_all_reduce_add_rmsnorm"
MAX_M = 256                 # rows of the one kernel (decode sizes); its row counters
SCHEDULES = ("fused", "sequential")
OPTIONS = {"fused": ("config",), "sequential": ("matmul_schedule",)}
WEIGHT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def matmul_all_reduce_add_rmsnorm(ctx, a, w, residual, norm_weight, eps: float = 1e-6,
                                  bias=None, out=None, residual_out=None,
                                  schedule: str = "auto", **options):
    """(out, res): res = all_reduce(a @ w.T) + bias + residual, out = rmsnorm(res) *
    norm_weight, both [M, N] in a's dtype; each a new tensor or the one given (`out`,
    `residual_out`; residual_out=residual adds in place). See the module docstring."""
    if is_compiling():             # torch.compile traces its stand-in (runtime/compiled.py)
        return STANDINS["matmul_all_reduce_add_rmsnorm"](
            ctx, a, w, residual, norm_weight, eps, bias, out, residual_out, schedule, **options)
    if eps.__class__ is not float:
        try:
            eps = _eps(eps)
        except ValueError as exc:       # before any build: the peers must hear of it
            raise ctx.fail_call(NAME, exc) from None
    key = (NAME, tensor_key(a), tensor_key(w), None if bias is None else tensor_key(bias),
           None if out is None else tensor_key(out), tensor_key(residual),
           tensor_key(norm_weight), None if residual_out is None else tensor_key(residual_out),
           eps, schedule, _options_key(options) if options else None, ctx.capturing())
    plan = ctx.plans.get(key)
    if plan is None or ctx.debug:
        return _first(ctx, key, plan, (a, w, bias, out, residual, norm_weight, residual_out),
                      eps, schedule, options)
    if out is None:
        out = plan.new_out()
    if residual_out is None:
        residual_out = plan.new_out()          # [M, N] in a's dtype: residual's shape too
    plan.run((a, w, bias, out, residual, norm_weight, residual_out))
    return out, residual_out


def _first(ctx, key, found, tensors, eps, schedule, options):
    """A new signature, or debug mode: through the plan driver (plans.call). A fresh out
    and res are made here (the plan passes them to its steps as the call's tensors 3, 6)."""
    a, w, bias, out, residual, norm_weight, res = tensors
    fresh = (out is None, res is None)
    if _matrices(a, w):
        def new():
            return torch.empty((a.shape[0], w.shape[0]), dtype=a.dtype, device=a.device)
        out = new() if out is None else out
        res = new() if res is None else res
        tensors = (a, w, bias, out, residual, norm_weight, res)
    capturing = key[-1]
    plans.call(ctx, key,
               lambda capture: _plan(_AsCaptured(ctx) if capture and not capturing else ctx,
                                     tensors, fresh, eps, schedule, options),
               tensors, first=lambda: ccl_common.agreed(ctx), found=found,
               signature=None if capturing else lambda: _signature(tensors, eps, schedule))
    return out, res


def _matrices(*ts) -> bool:
    return all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in ts)


def _signature(tensors, eps, schedule) -> tuple:
    """What debug mode checks is the same on every rank: M, N (each rank's K is its own),
    the dtypes, bias or not, eps and the schedule."""
    a, w, bias = tensors[:3]
    if not _matrices(a, w):
        return tuple(type(t).__name__ for t in tensors) + (schedule,)
    return (("M", a.shape[0]), ("N", w.shape[0]), ("dtype", str(a.dtype)),
            ("bias", bias is not None), ("eps", eps), ("schedule", schedule))


def _eps(eps) -> float:
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"{NAME}: eps must be a non-negative number, got {eps!r}")
    return float(eps)


def _check(ctx, a, w, bias, out, residual, norm_weight, res) -> None:
    """TypeError / ValueError that say what was expected (a, w, bias, out as the fused
    ops check them: _common.check_inputs)."""
    check_matrix(ctx, a, f"{NAME}: a")
    check_matrix(ctx, w, f"{NAME}: w")
    M, N = a.shape[0], w.shape[0]
    check_inputs(ctx, NAME, a, w, bias, out, (M, N), empty_k=True)
    for t, name, shape, dtypes in ((residual, "residual", (M, N), (a.dtype,)),
                                   (norm_weight, "norm_weight", (N,), WEIGHT_DTYPES),
                                   (res, "residual_out", (M, N), (a.dtype,))):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{NAME}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{NAME}: {name} must have shape {list(shape)} ([M, N] of a @ "
                             f"w.T for residual, [N] for norm_weight), got {list(t.shape)}")
        if t.dtype not in dtypes:
            raise TypeError(f"{NAME}: {name} must be {' or '.join(map(str, dtypes))}, got "
                            f"{t.dtype}")
        if t.device != ctx.device:
            raise ValueError(f"{NAME}: {name} is on {t.device}, expected {ctx.device}")
    for t, name in ((residual, "residual"), (norm_weight, "norm_weight"), (out, "out"),
                    (res, "residual_out")):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{NAME}: {name} must be contiguous, got strides {t.stride()}")
    if out is not None and out.data_ptr() in (residual.data_ptr(), norm_weight.data_ptr(),
                                              res.data_ptr()):
        raise ValueError(f"{NAME}: out must not be residual, residual_out or norm_weight")
    if res.data_ptr() == norm_weight.data_ptr():
        raise ValueError(f"{NAME}: residual_out must not be norm_weight")
    if res.data_ptr() != residual.data_ptr() and _overlap(res, residual):
        raise ValueError(f"{NAME}: residual_out must be residual itself (in place) or not "
                         f"overlap it")


def _overlap(x, y) -> bool:
    ax, bx = x.data_ptr(), x.data_ptr() + x.numel() * x.element_size()
    ay, by = y.data_ptr(), y.data_ptr() + y.numel() * y.element_size()
    return ax < by and ay < bx


def resolve(ctx, schedule, M: int, N: int, elem: int) -> str:
    """The schedule a call runs (the same on every rank: shared sizes, the agreed heap)."""
    if not isinstance(schedule, str) or schedule not in ("auto", *SCHEDULES):
        raise ValueError(f"{NAME}: unknown schedule {schedule!r}; choose one of "
                         f"{['auto', *SCHEDULES]}")
    if schedule == "sequential":
        return schedule
    why = why_not(ctx, M, N, elem)
    if why is None:
        return "fused"
    if schedule == "fused":
        raise ValueError(f"{NAME}: schedule 'fused' (one kernel) {why}; use "
                         f"schedule='sequential' (matmul_all_reduce, then the add and the "
                         f"norm) or 'auto', which falls back to it there")
    return "sequential"


def _options(name: str, schedule: str, options: dict) -> dict:
    """The options schedule `name` takes; under "auto", those of any schedule."""
    takes = OPTIONS[name]
    known = {o for s in SCHEDULES for o in OPTIONS[s]} if schedule == "auto" else set(takes)
    extra = set(options) - known
    if extra:
        raise TypeError(f"{NAME}: schedule {schedule!r} takes the options "
                        f"{sorted(known)}, got {sorted(extra)}")
    return {k: v for k, v in options.items() if k in takes}


def _plan(ctx, tensors, fresh: tuple, eps: float, schedule, options) -> Plan:
    """fresh: (out, res) made per call (Live in the kernel; no plan graph)."""
    a, w, bias, out, residual, norm_weight, res = tensors
    _check(ctx, a, w, bias, out, residual, norm_weight, res)
    _eps(eps)
    M, N = a.shape[0], w.shape[0]
    name = resolve(ctx, schedule, M, N, a.element_size())
    opts = _options(name, schedule, options)
    plan = Plan(tensors, name)
    plan.set_output((M, N), a.dtype, ctx.device)
    if name == "fused":
        _fused(ctx, plan, fresh, eps, **opts)
    else:
        _sequential(ctx, plan, fresh, eps, **opts)
    return plan


def why_not(ctx, M: int, N: int, elem: int) -> str | None:
    """Why the one kernel cannot take a call of M x N (elements of `elem` bytes), None where
    it can: the same on every rank (shared sizes, the agreed heap)."""
    if M > MAX_M:
        return f"takes at most {MAX_M} rows (decode sizes), got M={M}"
    cap = lamport.slot_bytes(ctx)
    if M * N * elem > cap:
        return (f"holds at most {cap} bytes of M x N partial sums per rank with this heap "
                f"({ctx.heap_size} bytes), got M={M}, N={N}: {M * N * elem}")
    return None


def _counters(ctx):
    """The row blocks' arrival counters (int32, all 0 between launches; ctx.reset zeroes
    them): one workspace of the context, the same size whatever the call."""
    ws = _common.workspace(ctx, NAME, 256, MAX_M)
    return ws.sync[int(getattr(_common.SYNC_FLAGS, "value", _common.SYNC_FLAGS)):]


def _fused(ctx, plan, fresh: tuple, eps: float, config=None) -> None:
    """The one kernel's launch (epilogue_lamport.py, NORM): out is Live(3), res Live(6)
    when made per call."""
    a, w, bias, out, residual, norm_weight, res = plan.tensors
    rp = row_parallel(ctx, NAME, a, w, bias, config)
    epilogue_lamport.launch(ctx, plan, NAME, a, w, out, rp.operands, rp.trace_buf, rp.grid,
                            rp.num_units, rp.meta,
                            norm=(residual, Live(6) if fresh[1] else res, norm_weight,
                                  _counters(ctx), eps))
    if rp.descriptors:
        addresses_only(plan.steps[-1], rp.descriptors)


def _sequential(ctx, plan, fresh: tuple, eps: float, matmul_schedule: str = "auto") -> None:
    """matmul_all_reduce's plan into a sum buffer (kept per shape, outside CUDA-graph
    pools: add_rmsnorm's), then torch's add and norm into res (a copy of residual first,
    unless res is residual), rounded as the kernel."""
    a, w, bias, out = plan.tensors[:4]
    M, K = a.shape
    N = w.shape[0]
    s = _unfused_sum(ctx, out)
    name = schedules.normalize("matmul_all_reduce", matmul_schedule)
    sub = schedule_plan(ctx, "matmul_all_reduce", a, w, bias, s, (M, N), name, {}, M, N, K)
    sub.finish("off")
    run = sub.run
    plan.add(lambda ts: run((ts[0], ts[1], ts[2], s)), graphable=sub.graphable)
    def add_norm(ts):
        if ts[6] is not ts[4]:
            ts[6].copy_(ts[4])
        torch_add_rmsnorm(s, ts[6], ts[5], ts[3], eps)
    # a fresh out or res per call: this step must not be frozen into a graph of the plan
    plan.add(add_norm, graphable=not any(fresh))
