"""Launch plans: the host work of a call, done once per signature.

An eager call must not spend longer on the host than its kernel spends on the GPU (a
small collective runs in 5-10 us). So the first call of an op with a given signature --
the op, its options, the algorithm mode (eager or CUDA-graph capture), and each tensor's
address, shape, strides and dtype -- checks the inputs, picks the algorithm, finds the
workspaces, makes the views and packs every kernel's arguments into a `Plan`. Later
calls with that signature look the plan up and run its steps: kernel launches through
the compiled kernel's own launcher (trident/runtime/triton_launch.py), and the copies that
stage a tensor that is not on the heap. Nothing that depends only on the signature is
checked twice; checks of values run on the device and report through the error word.

The cache (`ctx.plans`) is a bounded LRU (a hit stamps the plan; the order is brought up to
date only when a plan must go: PlanCache). `ctx.reset()`, `ctx.close()`, `ctx.free()`
and the start and end of a trace session empty it, so a plan never points at memory
that was handed back or at a trace buffer that is gone.

A plan reads its tensors' contents at every call, so it stays right when they change.
It keeps the addresses of the call's tensors, not the tensors (on GPUs); a tensor that
is freed and replaced by another of the same shape at the same address is the same
signature, and the plan is right for it too. For the same reason a plan of several
steps (a kernel and the copies that stage a tensor) can be one CUDA graph, replayed at
the cost of one launch, from its second call (see PlanCache). The collectives key a plan
of plain tensors (not on the heap) without their addresses (`plain_key`, Plan.plain): it
reads them at every call and holds none of them; where it has several steps, it keeps a
CUDA graph for each of a few addresses that came twice in a row (Plan._by_address).

Every op family -- the collectives (trident/ccl), the fused ops (trident/ops) and MoE
(trident/moe) -- goes through one driver: `call` (get-or-build, the capture twin, debug
mode's agreement across ranks, the run and debug mode's checks around it), or `plan_for`
(its first half) where the op runs the plan itself. An op's entry looks its key up first
and runs a plan it finds without the driver when not in debug mode (the warm path).
"""
from __future__ import annotations

from functools import partial

import torch

from . import options
from .triton_launch import Launch, Live

__all__ = ["Plan", "PlanCache", "Live", "tensor_key", "live_key", "plain_key", "call",
           "plan_for", "build_twin"]

GRAPH_AFTER = 1     # runs of a graphable plan before it becomes a CUDA graph (_until_graph)
ADDRESS_GRAPHS = 4     # graphs a plan of plain tensors keeps, one per address (_by_address)
ADDRESS_CAPTURES = 16  # captures such a plan makes at most, over its life


class Plan:
    """The steps of one call: each step is `step(tensors)`, where `tensors` are the call's
    own tensors in the op's order (for Live kernel arguments and staging copies).

    While it is built, `tensors` holds the build call's tensors; `finish()` drops them.
    `name` is the chosen algorithm; `debug_before` / `debug_after` are extra checks that
    run in debug mode only.
    """
    __slots__ = ("steps", "name", "tensors", "debug_before", "debug_after", "out_shape",
                 "graphable", "graph", "run", "new_out", "runs", "used", "placed", "plain",
                 "_plain_storages", "capturable", "at_graphs", "last_at", "captures")

    def __init__(self, tensors: tuple = (), name: str = "", plain: tuple = ()):
        self.steps: list = []
        self.tensors, self.name = tensors, name
        # plain: the indices of the call's tensors that the plan must not hold by address
        # (it is keyed without them: plain_key); () once anything in it does (_pin)
        self.plain = tuple(plain)
        self._plain_storages = {tensors[i].untyped_storage().data_ptr(): i for i in self.plain}
        self.debug_before = self.debug_after = None
        self.out_shape = None        # for ops that allocate their output per call
        self.new_out = None          # () -> a fresh output of out_shape (set_output)
        self.graphable = True        # every step may be captured into a CUDA graph
        self.capturable = True       # ... at the addresses of one call (Live ones included)
        self.graph = None
        self.at_graphs: dict = {}    # a plan of plain tensors: address -> graph (_by_address)
        self.last_at, self.captures = None, 0
        self.runs = 0                # runs before it became a graph (_until_graph)
        self.run = self.__call__     # after finish(): the cheapest callable that runs it
        self.used = self.placed = 0  # PlanCache's stamps: last use, and when it was placed

    def set_output(self, shape, dtype: torch.dtype, device: torch.device) -> None:
        """The op allocates a fresh output per call (the caller keeps it): `new_out()`
        makes it with everything but the allocation itself fixed now."""
        self.out_shape = shape = tuple(shape)
        self.new_out = partial(torch.empty, shape, dtype=dtype, device=device)

    def launch(self, kernel, grid, *args, **kwargs) -> None:
        """Add a launch of `kernel[grid](*args, **kwargs)`. In a plan of plain tensors, an
        argument that is a flat view of one at its address becomes Live (read per call)."""
        if self.plain:
            args = tuple(self._unpinned(a) for a in args)
            if any(self._holds(v) for v in kwargs.values()):
                self._pin()
        step = Launch(kernel, grid, args, kwargs, self.tensors)
        self.graphable &= not step.live        # a graph would freeze a Live tensor's address
        self.steps.append(step)

    def add(self, step, graphable: bool = True) -> None:
        """Add a host step: `step(tensors)` (a copy, or a call into torch.distributed,
        which is not graphable)."""
        self.graphable &= graphable
        self.capturable &= graphable
        self.steps.append(step)

    def finish(self, graphs: str = "off") -> "Plan":
        """Freeze the steps. graphs="multi" (or "all"): a plan of several steps (or any
        plan) becomes one CUDA graph, whose replay costs one launch on the host, when it
        runs again (`_until_graph`)."""
        self.settle()
        if self.plain:
            # keyed without the plain tensors' addresses: a graph would bake in the build
            # call's, and the next call's tensor lies elsewhere (a graph per address
            # instead: _by_address)
            self.graphable = False
        self.tensors, self._plain_storages = (), {}
        self.steps = tuple(self.steps)
        several = len(self.steps) >= (1 if graphs == "all" else 2)
        if graphs != "off" and self.graphable and several:
            self.run = self._until_graph
        elif graphs != "off" and self.plain and self.capturable and several \
                and self.new_out is None:
            self.run = self._by_address
        elif len(self.steps) == 1:
            self.run = self.steps[0]          # one Python frame less per call
        return self

    def _until_graph(self, tensors: tuple = ()) -> None:
        """`run` of a plan that may become a CUDA graph: its first GRAPH_AFTER runs run the
        steps, the next captures them and replays from then on. A key holds the addresses
        of the call's tensors, so a caller whose tensor is at a new address every call
        builds a plan per call (plain tensors take a plan keyed without their address
        instead, which is never a graph: Plan.plain), and must not also pay a capture per
        call (hundreds of µs against a few); a plan that comes back is replayed from its
        second call. A caller
        that kept this method (a shortcut) replays the graph once it exists. Never while
        the current stream is being captured: the steps then go into the caller's graph."""
        if self.graph is not None:
            return self.graph.replay()
        self.runs += 1
        if self.runs > GRAPH_AFTER and not torch.cuda.is_current_stream_capturing():
            self.graph = _capture(self.steps, tensors)
            replay = self.graph.replay
            self.run = lambda tensors=(): replay()
            return replay()
        for step in self.steps:
            step(tensors)

    def _by_address(self, tensors: tuple) -> None:
        """`run` of a plan of plain tensors with several steps (staging copies and a
        kernel): a call at the plain tensors' addresses of the call just before it captures
        the steps into a CUDA graph of those addresses, and a call at addresses with a
        graph replays it (one launch on the host instead of each step's). A call at new
        addresses runs the steps and captures nothing, so a caller whose tensors move
        every call pays no capture. The graph holds addresses, no tensor: a tensor that
        replaces another at the same address is the same call for it (module docstring).
        At most ADDRESS_GRAPHS graphs are kept (the oldest goes) and ADDRESS_CAPTURES
        made, so a caller cycling through more addresses stops capturing. Never while the
        current stream is being captured: the steps then go into the caller's graph."""
        at = tuple([tensors[i].data_ptr() for i in self.plain])
        graph = self.at_graphs.get(at)
        if graph is not None:
            return graph.replay()
        if at == self.last_at and self.captures < ADDRESS_CAPTURES \
                and not torch.cuda.is_current_stream_capturing():
            self.captures += 1
            graph = self.at_graphs[at] = _capture(self.steps, tensors)
            if len(self.at_graphs) > ADDRESS_GRAPHS:
                del self.at_graphs[next(iter(self.at_graphs))]
            return graph.replay()
        self.last_at = at
        for step in self.steps:
            step(tensors)

    def __call__(self, tensors: tuple = ()) -> None:
        """Run every step (what `run` is for a plan of several steps and no graph)."""
        for step in self.steps:
            step(tensors)

    # ---------------------------------------------------------------- plain tensors
    def settle(self) -> None:
        """Pin the plan (`_pin`) if a host step or debug check of it holds a plain tensor
        (finish() does this; plan_for before it chooses the key)."""
        if self.plain and any(self._holds(s) for s in
                              (*self.steps, self.debug_before, self.debug_after)):
            self._pin()

    def _pin(self) -> None:
        """Something in the plan holds a plain tensor's address: the plan is right for that
        address only, and goes under the call's address key (plan_for's `pinned`)."""
        self.plain, self._plain_storages = (), {}

    def _unpinned(self, arg):
        """`arg` as a launch argument of a plan of plain tensors: Live for a contiguous view
        of one of them at its address (e.g. its flat or word view), `arg` itself otherwise
        (pinning the plan when it still shares a plain tensor's storage)."""
        if not isinstance(arg, torch.Tensor) or not arg.numel():
            return arg
        index = self._plain_storages.get(arg.untyped_storage().data_ptr())
        if index is None:
            return arg
        if arg.data_ptr() == self.tensors[index].data_ptr() and arg.is_contiguous():
            return Live(index, arg.dtype)
        self._pin()
        return arg

    def _holds(self, obj, depth: int = 0) -> bool:
        """Whether `obj` -- a host step, a closure's contents, a partial's arguments --
        holds a tensor of a plain tensor's storage (a Launch checked its own in launch())."""
        storages = self._plain_storages
        if not storages or obj is None or isinstance(obj, Launch) or depth > 4:
            return False
        if isinstance(obj, torch.Tensor):
            return bool(obj.numel()) and obj.untyped_storage().data_ptr() in storages
        if isinstance(obj, (tuple, list)):
            return any(self._holds(o, depth + 1) for o in obj)
        if isinstance(obj, partial):
            return self._holds((obj.func, obj.args, tuple(obj.keywords.values())), depth + 1)
        owner = getattr(obj, "__self__", None)          # a bound method, e.g. t.copy_
        if isinstance(owner, torch.Tensor):
            return self._holds(owner, depth + 1)
        cells = getattr(obj, "__closure__", None) or ()
        return any(self._holds(c.cell_contents, depth + 1) for c in cells
                   if _filled(c))


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:               # a cell not yet bound
        return False
    return True


def _capture(steps, tensors):
    """The steps as one CUDA graph. The call's tensors are at the addresses the plan's key
    holds, so a replay reads and writes them exactly as running the steps would."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
        for step in steps:
            step(tensors)
    torch.cuda.current_stream().wait_stream(side)
    return graph


_Tensor = torch.Tensor


def tensor_key(t) -> tuple:
    """What a plan depends on of a tensor argument: address, shape, strides, dtype, device.

    A warm call pays for this on every tensor (each accessor is a C call of ~100 ns), so
    the device is left out where the address implies it: a CUDA process has one address
    space (UVA) in which device, host and mapped memory never overlap, so a nonzero address
    names one device. Address 0 (an empty tensor, a meta tensor) keeps the device."""
    if t.__class__ is _Tensor or isinstance(t, _Tensor):
        p = t.data_ptr()
        if p:
            return (p, t.shape, t.stride(), t.dtype)
        return (p, t.shape, t.stride(), t.dtype, t.device)
    return (type(t), id(t))      # not a tensor: the plan's build raises the clear error


def live_key(t) -> tuple:
    """The key of a tensor passed as Live (read at every call, e.g. a given output):
    shape, strides, dtype, device -- not the address, which the plan does not keep."""
    if t.__class__ is _Tensor or isinstance(t, _Tensor):
        return (t.shape, t.stride(), t.dtype, t.device)
    return (type(t), id(t))


def plain_key(t) -> tuple:
    """What a plan keyed without the address depends on of a plain tensor (one not on the
    heap, read by the plan at every call: Plan.plain): shape, strides, dtype, device, and
    the address and storage offset modulo 16 -- what the launch depends on of where it
    lies (Triton specialises a pointer on its 16-byte alignment; ccl/common.as_words copies
    a tensor that is not on a whole word)."""
    return (None, t.shape, t.stride(), t.dtype, t.data_ptr() & 15, t.storage_offset() & 15,
            t.get_device())


class PlanCache:
    """Plans of one context, least recently used first out beyond `capacity`
    (default: TRIDENT_PLAN_CACHE, 512). `builds` and `hits` count what happened.

    A hit only stamps the plan (`used`: the hit's number), so that a warm lookup hashes
    its key once (an OrderedDict's move_to_end on every hit hashed it twice: get took
    0.57 us on a CPU core for an all_reduce's key and 0.37 with the stamp, 1.09 and 0.63
    for MoE combine's; bench/lab/host_times.py). The dict keeps the
    order in which plans were placed, each with the stamp it had then (`placed`); when one
    must go and the first has been used since it was placed, the order is rebuilt from the
    stamps (a stable sort: plans of one stamp keep their order) before the first goes --
    exactly the least recently used, at O(n log n) once per wrap of the order instead of
    a second hash per hit.

    graphs (GPUs; $TRIDENT_PLAN_GRAPHS): "multi" (default) captures plans of several steps
    -- a kernel with staging copies -- into one CUDA graph each from their second run
    (Plan._until_graph), "all" every graphable plan, "off" none. Never while the stream is being captured (`capturing()`): a plan
    built then runs its steps into the user's graph.
    """

    def __init__(self, capacity: int | None = None, graphs: str = "off", capturing=None):
        self.capacity = capacity or options.get("TRIDENT_PLAN_CACHE")
        if graphs not in ("off", "multi", "all"):
            raise ValueError(f"plan graphs must be 'off', 'multi' or 'all', got {graphs!r}")
        self.graphs, self.capturing = graphs, capturing
        self._plans: dict = {}          # in the order placed (see above)
        self._get = self._plans.get
        self.builds = self.hits = 0
        self._error, self._raise = (0,), None
        self._shortcuts: list[dict] = []

    def watch(self, error_word, raise_error) -> None:
        """Before every lookup, check `error_word[0]` (host memory the device writes when a
        wait gives up: no sync) and call `raise_error(key)` when it is set, so that a call
        made after a failed one raises at once instead of running on state that is out of
        step (trident/runtime/context_sync.py `_on_error`: it may also return, and the
        lookup goes on). A memoryview element read: about 50 ns."""
        self._error, self._raise = error_word, raise_error

    @property
    def error_word(self):
        """What get() checks before every lookup (set by watch): a layer that calls plans'
        `run` from shortcuts() must check `error_word[0]` itself and take get()'s path,
        which raises, when it is set."""
        return self._error

    def shortcuts(self) -> dict:
        """A dict for a layer above trident's calls that keeps its own, cheaper keys to the
        `run` of this cache's plans (the torch.distributed backend's all_reduce): emptied
        whenever a plan leaves the cache (clear, eviction), so that it never runs a plan
        the cache dropped (e.g. after ctx.free or ctx.reset). Its user checks error_word."""
        d: dict = {}
        self._shortcuts.append(d)
        return d

    def drop_shortcuts(self) -> None:
        """Empty every shortcuts() dict (their users fill them again through get)."""
        for d in self._shortcuts:
            d.clear()

    def get(self, key):
        if self._error[0]:
            self._raise(key)
        plan = self._get(key)
        if plan is not None:
            plan.used = self.hits = self.hits + 1
        return plan

    def put(self, key, plan: Plan, for_capture: bool | None = None) -> Plan:
        """Store `plan` under `key`. for_capture: the plan runs inside a CUDA-graph capture
        (default: whether one is under way now), so it must not be a graph of its own."""
        if for_capture is None:
            for_capture = self.capturing is not None and self.capturing()
        plan.finish("off" if for_capture else self.graphs)
        self.builds += 1
        plan.used = plan.placed = self.hits
        self._plans.pop(key, None)          # a key put again goes last
        self._plans[key] = plan
        if len(self._plans) > self.capacity:
            self._evict()
            self.drop_shortcuts()
        return plan

    def alias(self, key, plan: Plan) -> None:
        """Store `plan`, already put under another key, under `key` too (not a build):
        plan_for keeps a plan of plain tensors under its build call's address key as well,
        so that a plain tensor that comes back at that address finds it at the first
        lookup, as a heap tensor does."""
        self._plans.pop(key, None)
        self._plans[key] = plan
        if len(self._plans) > self.capacity:
            self._evict()
            self.drop_shortcuts()

    def _evict(self) -> None:
        """Drop the least recently used plan (class docstring): the first in the order
        placed, once the order is rebuilt from the stamps if that one was used since."""
        plans = self._plans
        key, first = next(iter(plans.items()))
        if first.used != first.placed:
            order = sorted(plans.items(), key=_used)      # stable: ties keep their order
            plans.clear()
            plans.update(order)
            for _, plan in order:
                plan.placed = plan.used
            key = order[0][0]
        del plans[key]

    def clear(self) -> None:
        self._plans.clear()
        self.drop_shortcuts()

    def order(self) -> list:
        """The keys, least recently used first (tests; what eviction goes by)."""
        return [k for k, _ in sorted(self._plans.items(), key=_used)]

    def __contains__(self, key) -> bool:
        return key in self._plans

    def __len__(self) -> int:
        return len(self._plans)


def _used(item) -> int:
    return item[1].used


# ---------------------------------------------------------------------------- the driver
_LOOK = object()


def plan_for(ctx, key, build, signature=None, first=None, twin: bool = True,
             found=_LOOK, pinned=None) -> Plan:
    """The plan of `key` in `ctx.plans`, built first if the key is new.

    key: the call's signature; key[0] names the op (in errors), and where `twin` is on,
      key[-1] is whether a CUDA graph is being captured.
    build(capture): the plan of this call, for a capture (capture=True) or not.
    signature(): debug mode only, what must be the same on every rank (`ctx.agree`: one
      host collective, before anything is built or launched); None: nothing to agree on.
    first(): on a new key, before the agreement (the collectives' agreed facts).
    twin: on GPUs, an eager first call also builds the plan that a capture of the same
      call uses (key[:-1] + (True,)): that plan may pick another algorithm, whose first
      build would create a workspace -- a host barrier, which a capture cannot contain.
    found: what the caller's own `ctx.plans.get(key)` returned (the entries look up
      first, for the warm path), so that the key is not looked up twice.
    pinned: where `key` leaves out the addresses of plain tensors (plain_key), the call's
      key with them: a plan built that came out holding one of those addresses
      (Plan.plain is then ()) goes there instead, right for this address only; one that
      holds none goes under both (PlanCache.alias).

    A build runs inside ctx.building(key[0]): its host collectives name the op, and an
    error it raises is published to the peers (trident/api/context_ops.py)."""
    plans = ctx.plans
    plan = plans.get(key) if found is _LOOK else found
    if plan is None and first is not None:
        with ctx.building(key[0]):
            first()
    if signature is not None and ctx.debug:
        ctx.agree(key[0], *signature())
    if plan is None:
        with ctx.building(key[0]):
            capture = ctx.capturing()
            plan = build(capture)
            where = _where(plan, key, pinned)
            plan = plans.put(where, plan, for_capture=capture)
            if where is not pinned and pinned is not None:
                plans.alias(pinned, plan)
            if twin and not capture and ctx.backend == "cuda":
                build_twin(ctx, key, build, pinned)
    return plan


def _where(plan: Plan, key, pinned):
    """The key a plan built for `key` goes under (plan_for's `pinned`)."""
    plan.settle()
    return key if pinned is None or plan.plain else pinned


def build_twin(ctx, key, build, pinned=None) -> None:
    """Build and keep the plan that a CUDA-graph capture of `key`'s call uses (key[:-1] +
    (True,), by build(True)), unless it exists (plan_for does this on GPUs; `pinned` as
    there)."""
    other = key[:-1] + (True,)
    if other not in ctx.plans:
        plan = build(True)
        where = _where(plan, other, None if pinned is None else pinned[:-1] + (True,))
        if where not in ctx.plans:
            ctx.plans.put(where, plan, for_capture=True)


def call(ctx, key, build, tensors: tuple, signature=None, first=None, twin: bool = True,
         found=_LOOK, pinned=None):
    """Run the plan of `key` (`plan_for` gets or builds it) on `tensors`, the call's own
    tensors in the op's order; returns them. A plan that makes its output per call
    (Plan.set_output) gets a fresh one in place of a last tensor of None (or, where its
    new_out() gives None, the one its single step returns: ops/async_tp.py).

    Debug mode, outside a CUDA-graph capture (which cannot contain a host sync): the
    plan's debug_before(ctx, tensors) check, then after the run ctx.after_op() (every
    rank's errors, raised on every rank at this call) and debug_after(ctx, tensors)."""
    plan = plan_for(ctx, key, build, signature, first, twin, found, pinned)
    made = False
    if plan.new_out is not None and tensors[-1] is None:
        out = plan.new_out()              # a fresh tensor: the caller keeps it
        if out is None:                   # the plan makes it: its one step returns it
            made = True
        else:
            tensors = tensors[:-1] + (out,)
    debug = ctx.debug and not ctx.capturing()
    if debug and plan.debug_before is not None:
        plan.debug_before(ctx, tensors)
    result = plan.run(tensors)
    if made:
        tensors = tensors[:-1] + (result,)
    if debug:
        ctx.after_op()
        if plan.debug_after is not None:
            plan.debug_after(ctx, tensors)
    return tensors
