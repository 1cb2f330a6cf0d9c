"""What one warm call does on the host, counted: Triton launches, torch ops, torch.distributed
collectives, host synchronisations and the calls of chosen methods (e.g. a context's
node-local ops). Used by trident/bench/host.py and bench/lab/hierarchical.py.

  - Triton launches: every launch of a @triton.jit (or Gluon) kernel, whether through a
    launch plan's `Launch` or a direct `kernel[grid](...)`. On the CPU emulation they are
    the interpreter's GridExecutor calls; on GPUs Triton's launch_enter_hook, which the
    C launcher calls once per launch (a Launch takes its hooked path while counting:
    counts are taken apart from timings). A launch plan that runs as one CUDA graph (GPUs)
    counts as one launch. `launch_objects` counts Launch.__call__ alone.
  - torch ops: every op that reaches the dispatcher (a TorchDispatchMode), sorted into
    `kind`s: "collective" (c10d: torch.distributed), "view" (aliases and allocations:
    no device work), "kernel" (the rest: a copy, fill, index or reduction that runs on
    the device, one or more kernels each on a GPU). Ops made inside a Triton launch (the
    interpreter's own) are not the call's and are left out.
  - host syncs: ctx.sync() calls, .item()s and copies from a GPU to the host.
"""
from __future__ import annotations

import contextlib
import functools
from collections import Counter, defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

LAUNCH_OBJECTS = " Launch objects"      # (a name no kernel has)
# allocations: no device work
_ALLOCATIONS = frozenset(("aten.empty.memory_format", "aten.empty_strided.default",
                          "aten.empty_like.default", "aten.new_empty.default",
                          "aten.new_empty_strided.default", "aten.lift_fresh.default"))


def kind(func) -> str:
    """"collective", "view", "sync" (.item()) or "kernel" for a dispatched op (see the
    module docstring)."""
    name = str(func)
    if name.startswith(("c10d.", "_c10d_functional.")):
        return "collective"
    if name == "aten._local_scalar_dense.default":
        return "sync"
    if getattr(func, "is_view", False) or name in _ALLOCATIONS or name.startswith("aten.detach"):
        return "view"
    return "kernel"


def _to_host(func, args, out) -> bool:
    """Whether a copy op moved a GPU tensor's values to the host (the host waits)."""
    name = str(func)
    if name.startswith("aten.copy_") and len(args) >= 2:
        dst, src = args[0], args[1]
    elif name.startswith("aten._to_copy") and args:
        dst, src = out, args[0]
    else:
        return False
    return (isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor)
            and src.device.type == "cuda" and dst.device.type == "cpu")


class TorchOps(TorchDispatchMode):
    """Counts dispatched ops by `kind` and name (`ops[kind][name]`), and copies to the host
    (`to_host`), except while `paused` (inside a launch). An op of kind `forbid` raises
    RuntimeError instead of running (e.g. a collective that must not happen)."""

    def __init__(self, forbid: str | None = None):
        super().__init__()
        self.ops, self.to_host, self.paused, self.forbid = defaultdict(Counter), 0, 0, forbid

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.forbid is not None and kind(func) == self.forbid:
            raise RuntimeError(f"{func} ran where no {self.forbid} may")
        out = func(*args, **(kwargs or {}))
        if not self.paused:
            self.ops[kind(func)][str(func)] += 1
            self.to_host += _to_host(func, args, out)
        return out

    def total(self, which: str | None = None) -> int:
        """Ops of kind `which` (None: of every kind)."""
        return sum(sum(c.values()) for k, c in self.ops.items() if which in (None, k))


def count_torch_ops(fn, calls: int = 20) -> float:
    """Torch ops dispatched per call of fn() (all kinds), over `calls` calls."""
    with TorchOps() as mode:
        for _ in range(calls):
            fn()
    return mode.total() / calls


@contextlib.contextmanager
def triton_launches(mode: TorchOps | None = None):
    """Yields a Counter that counts every Triton launch in the block by kernel name, and
    Launch.__call__s under LAUNCH_OBJECTS; `mode`'s counting is paused inside a launch."""
    from triton.runtime import interpreter
    from triton import knobs
    from trident.runtime._env import INTERPRET
    from trident.runtime.triton_launch import Launch
    seen = Counter()
    launch_call = Launch.__call__

    def counted_launch(self, tensors=()):
        seen[LAUNCH_OBJECTS] += 1
        return launch_call(self, tensors)
    Launch.__call__ = counted_launch
    if INTERPRET:
        executor_call = interpreter.GridExecutor.__call__

        def counted(self, *args, **kwargs):
            seen[getattr(self.fn, "__name__", "?")] += 1
            if mode is not None:
                mode.paused += 1
            try:
                return executor_call(self, *args, **kwargs)
            finally:
                if mode is not None:
                    mode.paused -= 1
        interpreter.GridExecutor.__call__ = counted
    else:
        def hook(metadata):
            seen[getattr(metadata, "data", {}).get("name", "?")] += 1
        knobs.runtime.launch_enter_hook.add(hook)
    try:
        yield seen
    finally:
        Launch.__call__ = launch_call
        if INTERPRET:
            interpreter.GridExecutor.__call__ = executor_call
        else:
            knobs.runtime.launch_enter_hook.remove(hook)


GRAPH_REPLAY = "(a plan's CUDA graph)"


@contextlib.contextmanager
def plan_graphs(node, seen: Counter):
    """Count under GRAPH_REPLAY in `seen` each replay of a launch plan of `node` that runs as
    one CUDA graph (GPUs, TRIDENT_PLAN_GRAPHS: plans of several steps): one launch on the
    host, whose kernels no launch hook sees."""
    wrapped = []
    for plan in list(node.plans._plans.values()):
        if getattr(plan, "graph", None) is not None:
            def counted(tensors=(), run=plan.run):
                seen[GRAPH_REPLAY] += 1
                return run(tensors)
            wrapped.append((plan, plan.run))
            plan.run = counted
    try:
        yield
    finally:
        for plan, run in wrapped:
            plan.run = run


@contextlib.contextmanager
def method_calls(objects: list[tuple[object, tuple[str, ...]]]):
    """Yields a Counter of the outermost calls of each (object, method names) in the block
    ("name" -> calls; a method called from inside another counted one is not counted).
    The methods are wrapped as instance attributes and restored after."""
    seen, depth, undo = Counter(), [0], []

    def wrap(fn, name):
        @functools.wraps(fn)
        def counted(*args, **kwargs):
            seen[name] += depth[0] == 0
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
        return counted
    for obj, names in objects:
        for name in names:
            had = name in vars(obj)
            undo.append((obj, name, had, vars(obj).get(name)))
            setattr(obj, name, wrap(getattr(obj, name), name))
    try:
        yield seen
    finally:
        for obj, name, had, old in reversed(undo):
            if had:
                setattr(obj, name, old)
            else:
                delattr(obj, name)


def count_calls(node, fn, calls: int, steps: list[tuple[object, tuple[str, ...]]]) -> dict:
    """Per call of fn() (a warm call, `calls` of them), on this rank: Triton launches
    (`triton_launches`, by kernel `triton_names`; a plan's CUDA graph counts as one launch,
    named GRAPH_REPLAY; `launch_objects`), torch ops by kind
    (`torch_kernels`, `torch_views`, `torch_names` of the kernel ones), `collectives`
    (torch.distributed, by name), `intra_node_steps` (outermost calls of `steps`),
    `host_syncs`, `host_collectives` (trident's host exchanges) and plan `builds` of the
    node-local Context `node` (both 0 in a warm call)."""
    syncs = [0]
    real_sync = node.sync

    def counting_sync():
        syncs[0] += 1
        return real_sync()
    fn()          # warm: a plan that becomes a CUDA graph at its second run does so here
    node.sync = counting_sync
    step, builds = node._host_step, node.plans.builds
    try:
        with TorchOps() as mode, triton_launches(mode) as launches, \
                plan_graphs(node, launches), method_calls(steps) as stepped:
            for _ in range(calls):
                fn()
    finally:
        del node.sync
    objects = launches.pop(LAUNCH_OBJECTS, 0)

    def per(counter):
        return {k: v / calls for k, v in sorted(counter.items())}
    return dict(
        triton_launches=sum(launches.values()) / calls, launch_objects=objects / calls,
        triton_names=per(launches),
        torch_kernels=mode.total("kernel") / calls, torch_views=mode.total("view") / calls,
        torch_names=per(mode.ops["kernel"]),
        collectives=mode.total("collective") / calls,
        collective_names=per(mode.ops["collective"]),
        intra_node_steps=sum(stepped.values()) / calls, step_names=per(stepped),
        host_syncs=(syncs[0] + mode.total("sync") + mode.to_host) / calls,
        host_collectives=(node._host_step - step) / calls,
        builds=(node.plans.builds - builds) / calls)
