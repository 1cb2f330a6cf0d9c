"""The schedules of the fused ops: how all_gather_matmul, matmul_reduce_scatter and
matmul_all_reduce do their GEMM and their communication. One registry, read by the ops
(`schedule=`), by "auto" (trident/ops/auto.py), by `trident tune --ops` and the benches.

    "fused"       one Triton kernel: tiles move as soon as they are computed, GEMM and
                  transfer overlapped (producer/consumer programs with per-tile flags).
                  The large-M schedule (all_gather_matmul.py, matmul_reduce_scatter.py).
    "sequential"  trident's own collective, then cuBLAS (or cuBLAS, then the collective),
                  one stream, intermediates on the heap (sequential.py). The decode-size
                  floor every fusion must beat.
    "epilogue"    small M: one kernel whose GEMM programs push their finished tiles to
                  the peers and reduce where they meet (matmul_all_reduce /
                  matmul_reduce_scatter), or pull the rows of A they need from the peers
                  before their k-loop (all_gather_matmul) (epilogue.py).
    "pipelined"   mid and large M, async-TP style: cuBLAS on chunk i while chunk i+-1
                  moves (trident/ops/pipelined.py, registered there when it exists).
    "async_tp"    PyTorch's async-TP (torch.ops.symm_mem.fused_all_gather_matmul /
                  fused_matmul_reduce_scatter) on the context's group (async_tp.py); no
                  matmul_all_reduce, GPUs of their own only.
    "plain"       NCCL + cuBLAS through torch (plain.py); "nccl" is its alias.
    "auto"        picks one of the above (auto.py).

A schedule is a build function `build(ctx, plan, op, a, w, bias, out, **options)` that adds
the steps of one call to `plan` (trident/plans.py). Inputs are checked before; `out` is the
call's output as the build sees it (plan.tensors[3]): a kernel takes it as Live(3), a host
step reads it from its argument (`step(ts)`, ts = (a, w, bias, out) of the call). Every
schedule must give the same result (to bf16/fp16 rounding), must be capturable in a CUDA
graph (no host sync and no allocation in its steps: buffers on the heap or made at build),
and must take the same protocol decisions on every rank (from the sizes all ranks share:
M and K for all_gather_matmul, M and N for the row-parallel ops; or agreed).

To add one (trident/ops/pipelined.py does): at import,
    from .schedules import register
    register("pipelined", build, auto=True, ops=OPS, options=("chunks",), cost=None)
and the registry imports that module the first time a schedule is looked up (`_load`).
A schedule that runs only on some machines says why not elsewhere (`why_not`); auto never
picks it there and naming it raises a ValueError (`unavailable`, auto.resolve).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

OPS = ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce")
NAMES = ("auto", "fused", "sequential", "epilogue", "pipelined", "async_tp", "plain")
ALIASES = {"nccl": "plain"}     # the collectives' name for the torch.distributed path
# modules that register schedules when imported (a missing one registers nothing)
_MODULES = ("all_gather_matmul", "matmul_reduce_scatter", "sequential", "epilogue",
            "plain", "pipelined", "async_tp")


@dataclass(frozen=True)
class Schedule:
    """A registered schedule. auto: whether "auto" may pick it; needs_nccl: it runs
    torch.distributed collectives (not where ranks share a GPU); options: the keyword
    options its build takes; cost: (op, M, N, K, world, graph, hw) -> estimated us, the
    cost model's estimate where nothing is measured (None: auto picks it only from a
    measured table); why_not: (ctx, op) -> why it cannot run on this context (e.g. no GPU,
    a torch without the ops it calls), None where it can (None: it runs wherever its
    needs_nccl allows)."""
    name: str
    build: Callable
    ops: tuple = OPS
    auto: bool = True
    needs_nccl: bool = False
    options: tuple = ()
    cost: Callable | None = None
    about: str = field(default="", compare=False)
    why_not: Callable | None = field(default=None, compare=False)


_registry: dict[str, Schedule] = {}
_loaded = False


def register(name: str, build: Callable, *, ops=OPS, auto: bool = True,
             needs_nccl: bool = False, options=(), cost=None, about: str = "",
             why_not: Callable | None = None) -> Schedule:
    """Register (or replace) schedule `name` (one of NAMES other than "auto")."""
    if name not in NAMES or name == "auto":
        raise ValueError(f"schedule names are {NAMES[1:]}, got {name!r}")
    unknown = set(ops) - set(OPS)
    if unknown:
        raise ValueError(f"schedule {name!r}: unknown ops {sorted(unknown)}; ops are {OPS}")
    s = Schedule(name, build, tuple(ops), auto, needs_nccl, tuple(options), cost, about,
                 why_not)
    _registry[name] = s
    return s


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in _MODULES:
        try:
            importlib.import_module(f"{__package__}.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{mod}":
                raise


def registered(op: str | None = None) -> dict[str, Schedule]:
    """The registered schedules (of `op`), by name, in NAMES order."""
    _load()
    return {n: _registry[n] for n in NAMES if n in _registry
            and (op is None or op in _registry[n].ops)}


def normalize(op: str, schedule, algorithm=None, ctx=None) -> str:
    """The schedule a call asked for: `schedule`, or the older `algorithm=` keyword (an
    alias; both given must agree), "nccl" read as "plain". Raises ValueError listing the
    valid names for an unknown one, NotImplementedError for a known one not built.

    ctx: an op's entry checks this before any plan's build, so its error is also handed to
    the peers (ctx.fail_call): where this rank alone asked for a bad schedule, theirs stop
    at once naming it instead of waiting for this rank until their timeout (the first call
    of a context: in a host exchange, which then leaves the process group unusable)."""
    try:
        return _normalize(op, schedule, algorithm)
    except (TypeError, ValueError, NotImplementedError) as exc:
        if ctx is not None:
            ctx.fail_call(op, exc)
        raise


def _normalize(op: str, schedule, algorithm) -> str:
    if algorithm is not None:
        if schedule not in (None, "auto") and ALIASES.get(schedule, schedule) != \
                ALIASES.get(algorithm, algorithm):
            raise ValueError(f"{op}: schedule={schedule!r} and algorithm={algorithm!r} "
                             f"disagree; algorithm= is the older name of schedule=, pass one")
        schedule, word = algorithm, "algorithm (schedule)"
    else:
        word = "schedule"
    if schedule is None:
        schedule = "auto"
    if not isinstance(schedule, str):
        raise TypeError(f"{op}: {word} must be a str, one of {valid_names(op)}, got "
                        f"{type(schedule).__name__}")
    name = ALIASES.get(schedule, schedule)
    if name == "auto":
        return name
    known = registered(op)
    if name not in known:
        _load()
        if name in _registry:        # built, for other ops only (async_tp: no all-reduce)
            s = _registry[name]
            why = (s.why_not(None, op) if s.why_not else None) or f"it does {list(s.ops)}"
            raise ValueError(f"{op}: {word} {name!r} has no {op}: {why}; choose one of "
                             f"{valid_names(op)}")
        if name in NAMES:
            raise NotImplementedError(f"{op}: {word} {name!r} is not built yet in this "
                                      f"version of trident; choose one of {valid_names(op)}")
        raise ValueError(f"{op}: unknown {word} {schedule!r}; choose one of "
                         f"{valid_names(op)}")
    return name


def valid_names(op: str | None = None) -> list[str]:
    """The names a call of `op` accepts: "auto", the registered schedules, the aliases."""
    names = ["auto"] + list(registered(op))
    return names + [a for a, n in ALIASES.items() if n in names]


def unavailable(ctx, op: str, name: str, nccl: bool | None = None) -> str | None:
    """Why schedule `name` cannot run for `op` on `ctx`, None where it can: NCCL missing
    for a needs_nccl one (nccl: whether NCCL runs on every rank; default
    ccl.nccl.available(ctx)), else the schedule's own why_not."""
    s = get(name)
    if s.needs_nccl:
        from ..ccl import nccl as _nccl
        if not (_nccl.available(ctx) if nccl is None else nccl):
            return _nccl.unavailable_reason(ctx)
    return None if s.why_not is None else s.why_not(ctx, op)


def get(name: str) -> Schedule:
    _load()
    return _registry[name]


def build(ctx, plan, op: str, name: str, a, w, bias, out, options: dict) -> None:
    """Add the steps of schedule `name` (resolved: not "auto") to `plan`. `options` go to
    its build; one it does not take raises TypeError naming what it takes."""
    s = get(name)
    extra = set(options) - set(s.options)
    if extra:
        raise TypeError(f"{op}: schedule {name!r} takes the options {list(s.options)}, got "
                        f"{sorted(extra)}")
    s.build(ctx, plan, op, a, w, bias, out, **options)


def options_for(name: str, options: dict, op: str | None = None) -> dict:
    """The options of a call that schedule `name` takes: under "auto" a call's options go
    to whichever schedule is picked, and those it does not take are left out. One that no
    schedule of `op` takes (a misspelt name) raises TypeError naming those they take."""
    if op is not None:
        known = {o for s in registered(op).values() for o in s.options}
        extra = set(options) - known
        if extra:
            raise TypeError(f"{op}: schedule 'auto' passes options to the schedule it picks, "
                            f"which take {sorted(known)}; got {sorted(extra)}")
    s = get(name)
    return {k: v for k, v in options.items() if k in s.options}
