"""Collectives over the symmetric heap: all_gather, reduce_scatter, all_reduce,
all_to_all, broadcast (called as ctx.all_gather(...) etc.).

Every function runs a launch plan (trident/runtime/plans.py, through its driver plans.call): one
entry (`_collective`) for the five, whose plan `_build` makes by the table `_OPS` (each
op's checks, selector bytes, NCCL step and launch); the algorithms are those that
registry.py declares. Built on the first call of a
signature, a plan checks the inputs, picks an algorithm (`algorithm=` by name; "auto", the
default, asks the selector, which goes by size, world size and whether a CUDA graph is
being captured; "nccl" = torch.distributed) and packs one kernel launch, stream-ordered
and CUDA-graph capturable. Later calls of that signature only launch. `block` and
`programs` override the launch size (tests use them); further keyword options ("knobs":
warps, an algorithm's own such as broadcast relay's chunk) go to the named algorithm,
which must take them (`knobs`), and are part of the plan's key. In debug mode (ctx.debug) the ranks also check that they
called with the same sizes, and every op is synchronised and checked for timeouts.
"""
from __future__ import annotations

import math
import operator
from functools import partial

import torch
import torch.distributed as dist

from . import checks, common, nccl, registry
from .options import knobs
from ..runtime import plans
from ..runtime.compiled import STANDINS, is_compiling
from ..runtime.plans import Plan, plain_key, tensor_key
from .selector import select

# {op: {name: run function}} of trident's own algorithms (registry.py: registry.kernels),
# for callers that list them; a plan takes its run function from the registry itself
ALGORITHMS = registry.run_functions()
# {op: the names of its algorithms that need NCCL} (registry.py: "nccl"), offered where it runs
_NEEDS_NCCL = {op: [a.name for a in registry.ALGORITHMS if a.op == op and a.needs_nccl]
               for op in registry.OPS}


def _nccl_agreed(ctx) -> bool:
    """Whether the "nccl" algorithm can run on every rank (common.Agreed). The local
    flag too: where a rank cannot, neither could it when the ranks agreed, so this is the
    agreed value, unless a test has since made every rank's context unable."""
    return common.agreed(ctx).nccl and nccl.available(ctx)


def _algorithm(ctx, op: str, algorithm, nbytes: int, graph: bool, dtype) -> str:
    """The algorithm a call runs: `algorithm` by name, or the selector's choice for "auto"
    (also None, the default of earlier versions).

    The same on every rank: `algorithm` and `nbytes` (sizes that must agree; callers pass
    a stand-in where they may differ) are the call's; whether NCCL can run and the
    selector's tables are agreed (common.Agreed); `graph` (a CUDA graph is being
    captured) is the same on every rank when the ranks capture the same calls, which
    they must (debug mode checks it with the sizes). An algorithm that does not take
    `dtype` (registry.py `dtypes`) is never run: "auto" takes the op's first declared
    algorithm that does instead; naming it raises TypeError. Likewise "auto" passes over
    one whose capacity (`fits`) the message exceeds."""
    auto = algorithm is None or algorithm == "auto"
    has_nccl = _nccl_agreed(ctx)          # not where ranks share a GPU (on any rank)
    if auto:
        common.check_tables(ctx, op)
    name = select(op, nbytes, ctx.world_size, graph=graph, nccl=has_nccl) if auto else algorithm
    choices = (["auto"] + sorted(a.name for a in registry.kernels(op))
               + (_NEEDS_NCCL[op] if has_nccl else []))
    declared = registry.get(op, name)
    if declared is None:
        raise ValueError(f"{op}: unknown algorithm {name!r}; choose one of {choices}")
    if declared.needs_nccl and not has_nccl:
        raise ValueError(f"{op}: algorithm {name!r}: {nccl.unavailable_reason(ctx)}; "
                         f"choose one of {choices}")
    if not auto and not declared.takes(dtype):
        takes = [a.name for a in registry.kernels(op) if a.takes(dtype)]
        raise TypeError(f"{op}: algorithm {name!r} takes floating-point tensors only, "
                        f"got {dtype}; choose one of {['auto'] + takes}")
    if auto and not (declared.takes(dtype) and declared.fits(ctx, nbytes)):
        name = next(a.name for a in registry.kernels(op)
                    if a.auto and a.takes(dtype) and a.fits(ctx, nbytes))
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


def _run(ctx, key, build, tensors, *options, found=plans._LOOK, pinned=None):
    """Run the plan of `key` on `tensors` through the plan driver (plans.call), building
    it with build(ctx, *tensors, *options) first if this signature is new. The key's and
    the options' last item is whether a CUDA graph is being captured (a capture twin is
    built with True in its place).

    The context's first collective agrees on the facts of common.Agreed (one host
    exchange, on every rank: a first collective builds a plan everywhere). Debug mode
    then checks, with one host collective, that every rank called with the same sizes
    and options (before anything is allocated or launched). pinned: plans.plan_for's."""
    head = options[:-1]
    plans.call(ctx, key, lambda capture: build(ctx, *tensors, *head, capture), tensors,
               signature=lambda: signature(key[0], tensors, options),
               first=lambda: common.agreed(ctx), found=found, pinned=pinned)


def _collective(ctx, key: tuple, tensors: tuple) -> None:
    """The entry of the five collectives. `key` is the call's plan key and says all of
    it: (op, each tensor's tensor_key, the op's own options, algorithm, block, programs,
    the knobs as sorted pairs, whether a CUDA graph is being captured). A plan found is
    run at once (the warm path); else, and always in debug mode, the plan driver
    (plans.call through _run) builds it by the table _OPS.

    Plain tensors (not on the heap). A plan found under `key` is right for their
    addresses. Else the call takes the plan of its plain key (`_plain_key`: the key less
    those addresses), which reads them at every call and holds none of them (Plan.plain),
    so that a tensor allocated afresh per call (functional collectives, a model's
    activations) reuses one plan. A plan that came out holding one (plans.plan_for's
    `pinned`) goes under `key`: right for that address, built again for the next."""
    plans_ = ctx.plans
    plan = plans_.get(key)
    if plan is None:
        plain = _plain_key(ctx, key, tensors)
        if plain is not None:
            found = plans_.get(plain)
            if found is None or ctx.debug:
                _run(ctx, plain, _BUILD_PLAIN[key[0]], tensors, *key[len(tensors) + 1:],
                     found=found, pinned=key)
            else:
                found.run(tensors)
            return
    if plan is None or ctx.debug:
        _run(ctx, key, _BUILD[key[0]], tensors, *key[len(tensors) + 1:], found=plan)
    else:
        plan.run(tensors)


def _plain_key(ctx, key: tuple, tensors: tuple):
    """`key` with plans.plain_key in place of tensor_key for each tensor at an address
    outside the heap (a plain tensor; an empty one's key has no address already), or None
    where there is none -- or where two plain tensors overlap, which a plan built for
    tensors apart would not know (all_to_all refuses it; an all_gather may be given
    its input inside its output)."""
    n = len(tensors)
    if n == 1:                                  # all_reduce, broadcast: the common case
        p = key[1][0]
        if p.__class__ is int and p and not ctx.in_heap(p):
            return (key[0], plain_key(tensors[0]), *key[2:])
        return None
    parts, plain = list(key[1:n + 1]), []
    for i, t in enumerate(tensors):
        p = parts[i][0]
        if p.__class__ is int and p and not ctx.in_heap(p):
            parts[i] = plain_key(t)
            plain.append(t)
    if not plain:
        return None
    if len(plain) == 2:
        (a, b), (na, nb) = plain, (_nbytes(t) for t in plain)
        if a.data_ptr() < b.data_ptr() + nb and b.data_ptr() < a.data_ptr() + na:
            return None
    return (key[0], *parts, *key[n + 1:])


class _Op:
    """How `_build` makes one collective's plan (the table `_OPS`): tensors: how many;
    check(ctx, *tensors, *own) -> what the run needs (op code, splits) after the input
      checks (checks.py); own: the op's own options (op, src, splits);
    nbytes(tensors, own): the selector's bytes per rank; word(tensors): the element size
      the knobs' check counts in, or None (1);
    nccl(ctx, plan, fn, tensors, own, checked): add the torch.distributed step, `fn` (the
      run function of the registry's algorithm of engine "torch": ccl/nccl.py's);
    copy: with one rank, out = inp (else nothing to do); empty(tensors): nothing to move;
    launch(ctx, plan, fn, tensors, own, checked, block, programs, kw): add the algorithm
      `fn`'s launch (registry.py: its run function)."""
    __slots__ = ("tensors", "check", "nbytes", "word", "nccl", "copy", "empty", "launch")

    def __init__(self, tensors, check, nbytes, nccl, launch, copy=False, empty=None,
                 word=None):
        self.tensors, self.check, self.nbytes, self.word, self.nccl = (tensors, check, nbytes,
                                                                       word, nccl)
        self.copy, self.empty, self.launch = copy, empty, launch


def _build(op: str, ctx, *args, plain: bool = False) -> Plan:
    """The plan of a call of collective `op`: args = (*tensors, *own options, algorithm,
    block, programs, knobs, graph), as `_collective` passes them to `_run` (the key's
    options). plain: the plan is keyed without the addresses of the tensors that are not
    on the heap (`_plain_key`), so it must hold none of them (Plan.plain)."""
    spec = _OPS[op]
    tensors = args[:spec.tensors]
    *own, algorithm, block, programs, kw, graph = args[spec.tensors:]
    checked = spec.check(ctx, *tensors, *own)
    name = _algorithm(ctx, op, algorithm, spec.nbytes(tensors, own), graph, tensors[-1].dtype)
    kw = knobs(ctx, op, name, kw, block, programs,
               1 if spec.word is None else spec.word(tensors))
    if op == "all_to_all":
        _check_own_rows(ctx.rank, *checked)          # the pair known here
    plan = Plan(tensors, name, [i for i, t in enumerate(tensors) if t.data_ptr()
                                and not ctx.is_symmetric(t)] if plain else ())
    declared = registry.get(op, name)
    if declared.engine == "torch":          # nccl: at any world size, on empty tensors too
        ctx.agree_once(op, name, *_sizes(op, tensors, own))
        spec.nccl(ctx, plan, declared.run(), tensors, own, checked)
    elif ctx.world_size == 1:
        if spec.copy:
            plan.add(lambda ts: ts[0].copy_(ts[1]))
    elif spec.empty is None or not spec.empty(tensors):
        spec.launch(ctx, plan, declared.run(), tensors, own, checked, block, programs, kw)
    return plan


def build_plan(ctx, op: str, tensors: tuple, own: tuple = (), algorithm: str = "auto",
               graph: bool = False) -> Plan:
    """The plan of collective `op` (a name of the five) on `tensors` with its own options
    `own` (all_reduce's op; all_to_all's out_splits, in_splits; broadcast's src), built as
    a call would build it -- the checks, the selector's pick for `algorithm`, the
    workspace -- but neither cached nor run: for a layer that runs it as a step of a plan
    of its own (ops/sequential.py). graph: whether it will run inside a CUDA-graph capture
    (the selector reads the graph tables)."""
    return _build(op, ctx, *tensors, *own, algorithm, None, None, (), graph)


def _sizes(op: str, tensors, own) -> tuple:
    """What must be alike on every rank of a call handed to torch.distributed (agree_once):
    each tensor's elements and the dtype, the op's own options; all_to_all's rows may
    differ between ranks (its splits), so there only the dtype and a row's shape."""
    if op == "all_to_all":
        return str(tensors[1].dtype), tuple(tensors[1].shape[1:])
    return (*(t.numel() for t in tensors), str(tensors[-1].dtype),
            *(o for o in own if isinstance(o, (int, str))))


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _launch_all_reduce(ctx, plan, fn, ts, own, code, block, programs, kw):
    fn(ctx, plan, ts[0].view(-1), code, block=block, programs=programs, **kw)


def _launch_all_gather(ctx, plan, fn, ts, own, checked, block, programs, kw):
    out, inp = ts
    (words_out, words_in), finish = common.as_words(
        ctx, plan, [(out, 0, False, True), (inp, 1, True, False)])
    fn(ctx, plan, words_out, words_in, block=block, programs=programs, **kw)
    finish()


def _launch_reduce_scatter(ctx, plan, fn, ts, own, code, block, programs, kw):
    fn(ctx, plan, ts[0].view(-1), ts[1].view(-1), code, block=block, programs=programs, **kw)


def _launch_all_to_all(ctx, plan, fn, ts, own, splits, block, programs, kw):
    out, inp = ts
    out_splits, in_splits = splits
    if plan.name == "push":
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
    fn(ctx, plan, words_out, words_in, out_splits, in_splits, row, call,
       block=block, programs=programs, **kw)
    finish()


def _launch_broadcast(ctx, plan, fn, ts, own, checked, block, programs, kw):
    (words,), finish = common.as_words(ctx, plan, [(ts[0], 0, True, True)])
    fn(ctx, plan, words, own[0], block=block, programs=programs, **kw)
    finish()


def _nccl_all_to_all(ctx, plan, fn, ts, own, splits):
    out_splits, in_splits = splits
    plan.add(lambda ts: fn(ctx, ts[0], ts[1], out_splits, in_splits), graphable=False)
    plan.debug_before = lambda c, ts: _check_splits_agree(c, out_splits, in_splits)


def _a2a_nbytes(ts, own) -> int:
    # Every rank must pick the same algorithm. With splits given, the sizes may differ
    # between ranks, so the choice cannot depend on them: take the large-message row.
    # Splits of None (even) mean the same rows on every rank, and must be passed alike on
    # every rank (debug mode checks the rows and the Nones with the sizes).
    return _nbytes(ts[1]) if own[0] is None and own[1] is None else 1 << 62


# the five collectives: selector bytes per rank are all_reduce's and broadcast's tensor,
# all_gather's input block, reduce_scatter's output block, all_to_all's input
_OPS = {
    "all_reduce": _Op(
        1, checks.all_reduce, lambda ts, own: _nbytes(ts[0]),
        lambda ctx, plan, fn, ts, own, code: plan.add(
            lambda ts: fn(ctx, ts[0], own[0]), graphable=False),
        _launch_all_reduce, empty=lambda ts: not ts[0].numel()),
    "all_gather": _Op(
        2, checks.all_gather, lambda ts, own: _nbytes(ts[1]),
        lambda ctx, plan, fn, ts, own, _: plan.add(
            lambda ts: fn(ctx, ts[0], ts[1]), graphable=False),
        _launch_all_gather, copy=True, empty=lambda ts: not ts[1].numel()),
    "reduce_scatter": _Op(
        2, checks.reduce_scatter, lambda ts, own: _nbytes(ts[0]),
        lambda ctx, plan, fn, ts, own, code: plan.add(
            lambda ts: fn(ctx, ts[0], ts[1], own[0]), graphable=False),
        _launch_reduce_scatter, copy=True, empty=lambda ts: not ts[0].numel()),
    "all_to_all": _Op(2, checks.all_to_all, _a2a_nbytes, _nccl_all_to_all,
                      _launch_all_to_all, copy=True),
    "broadcast": _Op(
        1, checks.broadcast, lambda ts, own: _nbytes(ts[0]),
        lambda ctx, plan, fn, ts, own, _: plan.add(
            lambda ts: fn(ctx, ts[0], own[0]), graphable=False),
        _launch_broadcast, empty=lambda ts: not ts[0].numel(),
        # as_words' word: relay's chunk counts in it
        word=lambda ts: common.word_type(ts[0].element_size(), [_nbytes(ts[0])])[1]),
}
_BUILD = {op: partial(_build, op) for op in _OPS}
_BUILD_PLAIN = {op: partial(_build, op, plain=True) for op in _OPS}


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


# ---------------------------------------------------------------------------- entries
def all_reduce(ctx, t, op: str = "sum", algorithm: str = "auto", block=None, programs=None,
               **kw):
    """In place: t = op over ranks of t (floats accumulate in fp32, integers in their own
    type, wrapping around as torch's do). Returns t."""
    if is_compiling():             # torch.compile traces its stand-in (runtime/compiled.py)
        return STANDINS["all_reduce"](ctx, t, op, algorithm, block, programs, **kw)
    _collective(ctx, ("all_reduce", tensor_key(t), op, algorithm, block, programs,
                      tuple(sorted(kw.items())) if kw else (), ctx.capturing()), (t,))
    return t


def all_gather(ctx, out, inp, algorithm: str = "auto", block=None, programs=None, **kw):
    """out [world*n, ...] = every rank's inp [n, ...], in rank order. Returns out."""
    if is_compiling():             # torch.compile traces its stand-in (runtime/compiled.py)
        return STANDINS["all_gather"](ctx, out, inp, algorithm, block, programs, **kw)
    _collective(ctx, ("all_gather", tensor_key(out), tensor_key(inp), algorithm, block,
                      programs, tuple(sorted(kw.items())) if kw else (), ctx.capturing()),
                (out, inp))
    return out


def reduce_scatter(ctx, out, inp, op: str = "sum", algorithm: str = "auto", block=None,
                   programs=None, **kw):
    """out [n, ...] = this rank's block of the op over ranks of inp [world*n, ...]."""
    if is_compiling():             # torch.compile traces its stand-in (runtime/compiled.py)
        return STANDINS["reduce_scatter"](ctx, out, inp, op, algorithm, block, programs, **kw)
    _collective(ctx, ("reduce_scatter", tensor_key(out), tensor_key(inp), op, algorithm,
                      block, programs, tuple(sorted(kw.items())) if kw else (),
                      ctx.capturing()), (out, inp))
    return out


def _splits_key(splits):
    """all_to_all's splits in its plan key (the build's argument): a tuple of Python ints,
    so that splits given as a tensor, or as numpy or 0-d tensor ints, find the plan of
    the same counts instead of building one per call (a tensor's elements hash by
    identity; a CUDA tensor's tolist() waits for the device, as torch's all_to_all_single
    does with its split sizes). Where that fails (an int, floats), the value as given,
    which the build's check (checks.splits) refuses with a TypeError naming it."""
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    try:
        return tuple(map(operator.index, splits))
    except TypeError:
        try:
            return tuple(splits)
        except TypeError:
            return splits


def all_to_all(ctx, out, inp, out_splits=None, in_splits=None, algorithm: str = "auto",
               block=None, programs=None, **kw):
    """Rank r sends rows in_splits[p] of inp (in order) to rank p, and receives
    out_splits[p] rows from rank p into out (in rank order). None = even splits."""
    if is_compiling():             # torch.compile traces its stand-in (runtime/compiled.py)
        return STANDINS["all_to_all"](ctx, out, inp, out_splits, in_splits, algorithm, block,
                                      programs, **kw)
    _collective(ctx, ("all_to_all", tensor_key(out), tensor_key(inp),
                      None if out_splits is None else _splits_key(out_splits),
                      None if in_splits is None else _splits_key(in_splits), algorithm, block,
                      programs, tuple(sorted(kw.items())) if kw else (), ctx.capturing()),
                (out, inp))
    return out


def broadcast(ctx, t, src: int = 0, algorithm: str = "auto", block=None, programs=None, **kw):
    """t on every rank = t of rank `src`. Returns t."""
    if is_compiling():             # torch.compile traces its stand-in (runtime/compiled.py)
        return STANDINS["broadcast"](ctx, t, src, algorithm, block, programs, **kw)
    _collective(ctx, ("broadcast", tensor_key(t), src, algorithm, block, programs,
                      tuple(sorted(kw.items())) if kw else (), ctx.capturing()), (t,))
    return t


def all_reduce_plan(ctx, t, op: str = "sum") -> tuple:
    """(plan, plain): the plan a warm `all_reduce(ctx, t, op)` with the default options
    runs now, or None (not built, or dropped), for a layer above that keeps a shortcut to
    it (PlanCache.shortcuts; the torch.distributed backend); plain: it is the plan of t's
    plain key (`_plain_key`: right for a plain tensor of t's plans.plain_key at any
    address), not of t's address. The keys are all_reduce's."""
    key = ("all_reduce", tensor_key(t), op, "auto", None, None, (), ctx.capturing())
    plan = ctx.plans._get(key)
    if plan is None:
        plain = _plain_key(ctx, key, (t,))
        if plain is not None:
            return ctx.plans._get(plain), True
    return plan, False


from .add_rmsnorm import all_reduce_add_rmsnorm  # noqa: E402  (it uses _run above)

__all__ = ["all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast",
           "all_reduce_add_rmsnorm", "ALGORITHMS", "select"]
