"""Collectives over the symmetric heap: all_gather, reduce_scatter, all_reduce,
all_to_all, broadcast (called as ctx.all_gather(...) etc.).

Every function runs a launch plan (trident/plans.py): built on the first call of a
signature, it checks the inputs, picks an algorithm (`algorithm=` by name; "auto", the
default, asks the selector, which goes by size, world size and whether a CUDA graph is
being captured; "nccl" = torch.distributed) and packs one kernel launch, stream-ordered
and CUDA-graph capturable. Later calls of that signature only launch. `block` and
`programs` override the launch size (tests use them); further keyword options ("knobs":
warps, an algorithm's own such as broadcast relay's chunk) go to the named algorithm,
which must take them (`knobs`, as registry.py declares), and are part of the plan's key. In debug mode (ctx.debug) the ranks also check that they
called with the same sizes, and every op is synchronised and checked for timeouts.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from . import checks, common, nccl, registry
from .options import knobs
from ..plans import Plan, tensor_key
from .selector import select

# {op: {name: run function}} of every algorithm that registry.py declares
ALGORITHMS = registry.run_functions()
ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, ALL_TO_ALL, BROADCAST = (
    ALGORITHMS[op] for op in registry.OPS)


def _nccl_agreed(ctx) -> bool:
    """Whether the "nccl" algorithm can run on every rank (common.Agreed). The local
    flag too: where a rank cannot, neither could it when the ranks agreed, so this is the
    agreed value, unless a test has since made every rank's context unable."""
    return common.agreed(ctx).nccl and nccl.available(ctx)


def _algorithm(ctx, op: str, algorithm, nbytes: int, graph: bool) -> str:
    """The algorithm a call runs: `algorithm` by name, or the selector's choice for "auto"
    (also None, the default of earlier versions).

    The same on every rank: `algorithm` and `nbytes` (sizes that must agree; callers pass
    a stand-in where they may differ) are the call's; whether NCCL can run and the
    selector's tables are agreed (common.Agreed); `graph` (a CUDA graph is being
    captured) is the same on every rank when the ranks capture the same calls, which
    they must (debug mode checks it with the sizes)."""
    auto = algorithm is None or algorithm == "auto"
    has_nccl = _nccl_agreed(ctx)          # not where ranks share a GPU (on any rank)
    if auto:
        common.check_tables(ctx, op)
    name = select(op, nbytes, ctx.world_size, graph=graph, nccl=has_nccl) if auto else algorithm
    choices = ["auto"] + sorted(ALGORITHMS[op]) + (["nccl"] if has_nccl else [])
    if name == "nccl":
        if not has_nccl:
            raise ValueError(f"{op}: algorithm 'nccl': {nccl.unavailable_reason(ctx)}; "
                             f"choose one of {choices}")
    elif name not in ALGORITHMS[op]:
        raise ValueError(f"{op}: unknown algorithm {name!r}; choose one of {choices}")
    return name


def signature(op: str, tensors, options) -> tuple:
    """What must agree across ranks in a call of `op` (`options`: the plan builder's, the
    last being whether a CUDA graph is being captured): each tensor's shape and dtype and
    every option -- the algorithm, launch sizes, knobs, the capture. Except all_to_all's
    splits (its first two options), which may differ, and with them its tensors' rows,
    unless both splits are None: even splits, where every rank has the same rows."""
    rows = True
    if op == "all_to_all":
        rows = options[0] is None and options[1] is None
        options = options[2:]
    sig = [(tuple(t.shape) if rows else tuple(t.shape[1:]), str(t.dtype))
           if isinstance(t, torch.Tensor) else type(t).__name__ for t in tensors]
    return tuple(sig) + tuple(options)


def _run(ctx, key, build, tensors, *options):
    """Run the plan of `key` on `tensors`, building it first if this signature is new.
    The key's and the options' last item is whether a CUDA graph is being captured.

    The context's first collective agrees on the facts of common.Agreed (one host
    exchange, on every rank: a first collective builds a plan everywhere). Debug mode
    then checks, with one host collective, that every rank called with the same sizes
    and options (before anything is allocated or launched). An eager first call on a GPU
    also builds the plan a capture of the same call will use (the graph table may pick
    another algorithm, whose workspace cannot be created during a capture)."""
    plan = ctx.plans.get(key)
    if plan is None:
        with ctx.building(key[0]):
            common.agreed(ctx)
    if ctx.debug:
        ctx.agree(key[0], *signature(key[0], tensors, options))
    if plan is None:
        with ctx.building(key[0]):
            plan = ctx.plans.put(key, build(ctx, *tensors, *options), for_capture=key[-1])
            if ctx.backend == "cuda" and not key[-1]:
                twin = key[:-1] + (True,)
                if twin not in ctx.plans:
                    ctx.plans.put(twin, build(ctx, *tensors, *options[:-1], True),
                                  for_capture=True)
    debug = ctx.debug and not key[-1]     # no host sync or exchange inside a CUDA-graph capture
    if debug and plan.debug_before is not None:
        plan.debug_before(ctx, tensors)
    plan.run(tensors)
    if debug:
        ctx.after_op()        # every rank's errors, raised on every rank at this call
        if plan.debug_after is not None:
            plan.debug_after(ctx, tensors)


def all_reduce(ctx, t, op: str = "sum", algorithm: str = "auto", block=None, programs=None,
               **kw):
    """In place: t = op over ranks of t (fp32 accumulation). Returns t."""
    kw = tuple(sorted(kw.items())) if kw else ()
    key = ("all_reduce", tensor_key(t), op, algorithm, block, programs, kw, ctx.capturing())
    plan = ctx.plans.get(key)
    if plan is None or ctx.debug:
        _run(ctx, key, _plan_all_reduce, (t,), op, algorithm, block, programs, kw, key[-1])
    else:
        plan.run((t,))
    return t


def all_reduce_plan(ctx, t, op: str = "sum"):
    """The plan a warm `all_reduce(ctx, t, op)` with the default options runs now, or None
    (not built, or dropped): for a layer above that keeps a shortcut to it
    (PlanCache.shortcuts; the torch.distributed backend). The same key as all_reduce's."""
    return ctx.plans._get(("all_reduce", tensor_key(t), op, "auto", None, None, (),
                           ctx.capturing()))


def _plan_all_reduce(ctx, t, op, algorithm, block, programs, kw, graph) -> Plan:
    code = checks.all_reduce(ctx, t, op)
    name = _algorithm(ctx, "all_reduce", algorithm, t.numel() * t.element_size(), graph)
    kw = knobs(ctx, "all_reduce", name, kw, block, programs)
    plan = Plan((t,), name)
    if name == "nccl":
        plan.add(lambda ts: nccl.all_reduce(ctx, ts[0], op), graphable=False)
    elif ctx.world_size > 1 and t.numel():
        ALL_REDUCE[name](ctx, plan, t.view(-1), code, block=block, programs=programs, **kw)
    return plan


def all_gather(ctx, out, inp, algorithm: str = "auto", block=None, programs=None, **kw):
    """out [world*n, ...] = every rank's inp [n, ...], in rank order. Returns out."""
    kw = tuple(sorted(kw.items())) if kw else ()
    key = ("all_gather", tensor_key(out), tensor_key(inp), algorithm, block, programs, kw,
           ctx.capturing())
    plan = ctx.plans.get(key)
    if plan is None or ctx.debug:
        _run(ctx, key, _plan_all_gather, (out, inp), algorithm, block, programs, kw, key[-1])
    else:
        plan.run((out, inp))
    return out


def _plan_all_gather(ctx, out, inp, algorithm, block, programs, kw, graph) -> Plan:
    checks.all_gather(ctx, out, inp)
    name = _algorithm(ctx, "all_gather", algorithm, inp.numel() * inp.element_size(), graph)
    kw = knobs(ctx, "all_gather", name, kw, block, programs)
    plan = Plan((out, inp), name)
    if name == "nccl":
        plan.add(lambda ts: nccl.all_gather(ctx, ts[0], ts[1]), graphable=False)
    elif ctx.world_size == 1:
        plan.add(lambda ts: ts[0].copy_(ts[1]))
    elif inp.numel():
        (words_out, words_in), finish = common.as_words(
            ctx, plan, [(out, 0, False, True), (inp, 1, True, False)])
        ALL_GATHER[name](ctx, plan, words_out, words_in, block=block, programs=programs, **kw)
        finish()
    return plan


def reduce_scatter(ctx, out, inp, op: str = "sum", algorithm: str = "auto", block=None,
                   programs=None, **kw):
    """out [n, ...] = this rank's block of the op over ranks of inp [world*n, ...]."""
    kw = tuple(sorted(kw.items())) if kw else ()
    key = ("reduce_scatter", tensor_key(out), tensor_key(inp), op, algorithm, block, programs,
           kw, ctx.capturing())
    plan = ctx.plans.get(key)
    if plan is None or ctx.debug:
        _run(ctx, key, _plan_reduce_scatter, (out, inp), op, algorithm, block, programs, kw,
             key[-1])
    else:
        plan.run((out, inp))
    return out


def _plan_reduce_scatter(ctx, out, inp, op, algorithm, block, programs, kw, graph) -> Plan:
    code = checks.reduce_scatter(ctx, out, inp, op)
    name = _algorithm(ctx, "reduce_scatter", algorithm, out.numel() * out.element_size(), graph)
    kw = knobs(ctx, "reduce_scatter", name, kw, block, programs)
    plan = Plan((out, inp), name)
    if name == "nccl":
        plan.add(lambda ts: nccl.reduce_scatter(ctx, ts[0], ts[1], op), graphable=False)
    elif ctx.world_size == 1:
        plan.add(lambda ts: ts[0].copy_(ts[1]))
    elif out.numel():
        REDUCE_SCATTER[name](ctx, plan, out.view(-1), inp.view(-1), code, block=block,
                             programs=programs, **kw)
    return plan


def all_to_all(ctx, out, inp, out_splits=None, in_splits=None, algorithm: str = "auto",
               block=None, programs=None, **kw):
    """Rank r sends rows in_splits[p] of inp (in order) to rank p, and receives
    out_splits[p] rows from rank p into out (in rank order). None = even splits."""
    kw = tuple(sorted(kw.items())) if kw else ()
    key = ("all_to_all", tensor_key(out), tensor_key(inp),
           None if out_splits is None else tuple(out_splits),
           None if in_splits is None else tuple(in_splits), algorithm, block, programs, kw,
           ctx.capturing())
    plan = ctx.plans.get(key)
    if plan is None or ctx.debug:
        _run(ctx, key, _plan_all_to_all, (out, inp), out_splits, in_splits, algorithm, block,
             programs, kw, key[-1])
    else:
        plan.run((out, inp))
    return out


def _plan_all_to_all(ctx, out, inp, out_splits, in_splits, algorithm, block, programs, kw,
                     graph) -> Plan:
    even = out_splits is None and in_splits is None
    out_splits, in_splits = checks.all_to_all(ctx, out, inp, out_splits, in_splits)
    # Every rank must pick the same algorithm. With splits given, the sizes may differ
    # between ranks, so the choice cannot depend on them: take the large-message row.
    # Splits of None (even) mean the same rows on every rank, and must be passed alike on
    # every rank (debug mode checks the rows and the Nones with the sizes).
    nbytes = inp.numel() * inp.element_size() if even else 1 << 62
    name = _algorithm(ctx, "all_to_all", algorithm, nbytes, graph)
    kw = knobs(ctx, "all_to_all", name, kw, block, programs)
    _check_own_rows(ctx.rank, out_splits, in_splits)      # the pair known here
    plan = Plan((out, inp), name)
    if name == "nccl":
        plan.add(lambda ts: nccl.all_to_all(ctx, ts[0], ts[1], out_splits, in_splits),
                 graphable=False)
        plan.debug_before = lambda c, ts: _check_splits_agree(c, out_splits, in_splits)
    elif ctx.world_size == 1:
        plan.add(lambda ts: ts[0].copy_(ts[1]))
    else:
        if name == "push":
            # push stages a plain output (its size differs between ranks, so staging takes
            # the bounded buffer: common.stage), but skips stage() for a zero-row heap
            # view: the buffer every rank must make is made here.
            common.stage_buffer(ctx, "stage.out")
        row_bytes = math.prod(inp.shape[1:]) * inp.element_size()
        (words_out, words_in), finish = common.as_words(
            ctx, plan, [(out, 0, False, True), (inp, 1, True, False)], unit=row_bytes)
        row = row_bytes // words_out.element_size()
        # what the call's fingerprint covers besides the launch: the rows' dtype and shape
        call = (str(inp.dtype), tuple(inp.shape[1:]))
        ALL_TO_ALL[name](ctx, plan, words_out, words_in, out_splits, in_splits, row, call,
                         block=block, programs=programs, **kw)
        finish()
    return plan


def _check_own_rows(rank: int, out_splits, in_splits) -> None:
    """The rows a rank sends itself are known on that rank alone: raise ValueError (before
    anything is launched: the peers' waits then stop at once, naming it) unless its
    in_splits and out_splits agree on them. Between ranks the kernels check the counts
    (CallMismatch: all_to_all/one_shot.py, push.py)."""
    if in_splits[rank] != out_splits[rank]:
        raise ValueError(_splits_differ(rank, in_splits[rank], rank, out_splits[rank]))


def _check_splits_agree(ctx, out_splits, in_splits) -> None:
    """Debug mode, before a torch.distributed all_to_all: every rank checks the whole
    split matrix, so all raise together instead of some entering the collective."""
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, (list(out_splits), list(in_splits)), group=ctx.group)
    _match_splits(everyone)


def _match_splits(everyone) -> None:
    """Raise ValueError unless every rank's in_splits[p] is rank p's out_splits for it
    (`everyone`: each rank's (out_splits, in_splits), in rank order)."""
    for src, (_, sends) in enumerate(everyone):
        for dst, (receives, _) in enumerate(everyone):
            if sends[dst] != receives[src]:
                raise ValueError(_splits_differ(src, sends[dst], dst, receives[src]))


def _splits_differ(src: int, sends: int, dst: int, receives: int) -> str:
    return (f"all_to_all: a rank's in_splits[p] differs from rank p's out_splits for it "
            f"(rank {src} sends {sends} rows to rank {dst}, which expects {receives})")


def broadcast(ctx, t, src: int = 0, algorithm: str = "auto", block=None, programs=None, **kw):
    """t on every rank = t of rank `src`. Returns t."""
    kw = tuple(sorted(kw.items())) if kw else ()
    key = ("broadcast", tensor_key(t), src, algorithm, block, programs, kw, ctx.capturing())
    plan = ctx.plans.get(key)
    if plan is None or ctx.debug:
        _run(ctx, key, _plan_broadcast, (t,), src, algorithm, block, programs, kw, key[-1])
    else:
        plan.run((t,))
    return t


def _plan_broadcast(ctx, t, src, algorithm, block, programs, kw, graph) -> Plan:
    checks.broadcast(ctx, t, src)
    name = _algorithm(ctx, "broadcast", algorithm, t.numel() * t.element_size(), graph)
    word = common.word_type(t.element_size(), [t.numel() * t.element_size()])[1]  # as_words'
    kw = knobs(ctx, "broadcast", name, kw, block, programs, word)
    plan = Plan((t,), name)
    if name == "nccl":
        plan.add(lambda ts: nccl.broadcast(ctx, ts[0], src), graphable=False)
    elif ctx.world_size > 1 and t.numel():
        (words,), finish = common.as_words(ctx, plan, [(t, 0, True, True)])
        BROADCAST[name](ctx, plan, words, src, block=block, programs=programs, **kw)
        finish()
    return plan


from .add_rmsnorm import all_reduce_add_rmsnorm  # noqa: E402  (it uses _run above)

__all__ = ["all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast",
           "all_reduce_add_rmsnorm", "ALGORITHMS", "select"]
