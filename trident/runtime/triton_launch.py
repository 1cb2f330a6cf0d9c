"""Queue a Triton kernel whose arguments are all known in advance, at the cost of one C call.

`kernel[grid](*args)` runs Triton's JIT front door on every call: it binds and
specialises the arguments, hashes them to find the compiled kernel, builds launch
metadata, and only then calls the launcher (about 19 us with 15 arguments on an H200
host). A launch plan (trident/runtime/plans.py) knows all of that after its first call, so a
`Launch` compiles once and from then on calls the compiled kernel's C launcher with
arguments packed when the plan was built; only the current stream is read per call.
Launch hooks (`triton.knobs.runtime.launch_enter_hook`, e.g. the proton profiler) still
see every launch: with a hook set, a Launch goes through CompiledKernel's runner.

This is the one module of trident that depends on Triton's internals (triton 3.6):
  - JITFunction.warmup(*args, grid=..., **kwargs) returns the CompiledKernel;
  - CompiledKernel.run (a CudaLauncher), .function and .packed_metadata;
  - CudaLauncher.launch, the C entry point, takes (gridX, gridY, gridZ, stream, function,
    launch_cooperative_grid, launch_pdl, global_scratch, profile_scratch,
    packed_metadata, launch_metadata, enter_hook, exit_hook, *kernel_args), pointers as
    plain ints, every parameter in order (constexpr ones too; the launcher skips them).
`internals_problem()` checks these against the installed Triton; tests/test_triton_launch.py
runs it in CI. If they changed, or on the CPU emulation, a Launch takes the ordinary
`kernel[grid](...)` path instead: slower, never wrong.
"""
from __future__ import annotations

import inspect
import re
import warnings

import torch

from ._env import INTERPRET
from .graph_pools import outside_graph_pools


class Live:
    """A kernel argument that is one of the call's own tensors, read at every launch.

    For tensors a plan must not keep (a fresh output allocated per call, a plain tensor of
    a plan keyed without its address: plans.plain_key); everything else is fixed when the
    plan is built. `dtype`: the argument is the tensor's flat view as `dtype` (the word
    views of ccl/common.as_words), at the tensor's own address.
    """
    __slots__ = ("index", "dtype")

    def __init__(self, index: int, dtype=None):
        self.index, self.dtype = index, dtype

    def value(self, tensors: tuple):
        """The argument for the call's `tensors`."""
        t = tensors[self.index]
        if self.dtype is None or self.dtype == t.dtype:
            return t
        return t.view(-1).view(torch.uint8).view(self.dtype)


def _squash(src: str) -> str:
    return re.sub(r"\s+", "", src)


_problem: str | None | bool = False          # False: not checked yet


def internals_problem() -> str | None:
    """None if the Triton internals this module relies on are as expected, else why not."""
    global _problem
    if _problem is not False:
        return _problem
    try:
        from triton import knobs
        from triton.backends.nvidia.driver import CudaLauncher
        from triton.runtime.jit import JITFunction
        params = list(inspect.signature(CudaLauncher.__call__).parameters)
        if params != ["self", "gridX", "gridY", "gridZ", "stream", "function", "args"]:
            _problem = f"CudaLauncher.__call__ takes {params}"
        elif "self.launch(gridX,gridY,gridZ,stream,function,self.launch_cooperative_grid," \
             "self.launch_pdl,global_scratch,profile_scratch,*args)" not in \
                _squash(inspect.getsource(CudaLauncher.__call__)):
            _problem = "CudaLauncher.__call__ no longer calls self.launch the way it did"
        elif "kernel.run(grid_0,grid_1,grid_2,stream,kernel.function,kernel.packed_metadata," \
             "launch_metadata," not in _squash(inspect.getsource(JITFunction.run)):
            _problem = "JITFunction.run no longer calls kernel.run the way it did"
        elif not hasattr(JITFunction, "warmup"):
            _problem = "JITFunction.warmup is gone"
        elif not isinstance(getattr(knobs.runtime.launch_enter_hook, "calls", None), list):
            _problem = "knobs.runtime.launch_enter_hook is no longer a HookChain"
        else:
            _problem = None
    except Exception as e:                    # noqa: BLE001 -- any change means "fall back"
        _problem = f"{type(e).__name__}: {e}"
    if _problem:
        warnings.warn(f"trident: Triton's launch internals changed ({_problem}); launch plans "
                      f"use the ordinary (slower) kernel launch", RuntimeWarning, stacklevel=3)
    return _problem


def _bind(kernel, args, kwargs) -> tuple[list, dict]:
    """Every parameter of `kernel` in order (defaults applied), and the launch options."""
    names = kernel.arg_names
    params = {k: v for k, v in kwargs.items() if k in names}
    options = {k: v for k, v in kwargs.items() if k not in names}
    bound = inspect.signature(kernel.fn).bind(*args, **params)
    bound.apply_defaults()
    return list(bound.arguments.values()), options


def not_the_calls(values, tensors) -> tuple:
    """The tensors among `values` whose storage is not that of one of the call's own
    `tensors` (heap tensors share the heap's storage, which the context owns)."""
    own = {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)}
    return tuple(v for v in values if isinstance(v, torch.Tensor)
                 and v.untyped_storage().data_ptr() not in own)


class Launch:
    """One kernel launch with fixed grid and arguments; `launch(tensors)` queues it on the
    current stream. Arguments given as `Live(i)` (positional only) are taken from
    `tensors[i]` at each call.

    On GPUs the launch keeps only the addresses of the call's own tensors (their storage):
    the plan's key holds those addresses, so a plan cannot outlive them unnoticed. Every
    other tensor argument -- a split table, a buffer made for this plan -- is kept alive by
    the launch (`keep`), since nothing else promises to: a cache that dropped such a tensor
    while a plan still launched with its address made kernels read freed memory (wrong
    all_to_all results, then a misaligned-address crash, in the 2x H200 soak).
    On the ordinary path (CPU emulation, changed Triton internals) it keeps the arguments.
    """
    __slots__ = ("kernel", "grid", "args", "kwargs", "live", "fast", "direct", "compiled",
                 "prefix", "packed", "tail", "stream", "device", "hooks", "scratch",
                 "capturing", "one_live", "head", "rest", "torch_device", "keep", "views")

    def __init__(self, kernel, grid: tuple, args: tuple, kwargs: dict, tensors: tuple = ()):
        self.kernel, self.grid = kernel, tuple(grid) + (1,) * (3 - len(grid))
        self.args, self.kwargs = tuple(args), kwargs
        self.live = [(i, a.index) for i, a in enumerate(args) if isinstance(a, Live)]
        self.views = {i: a for i, a in enumerate(args) if isinstance(a, Live) and a.dtype}
        self.fast = None
        self.direct = False          # the hot path: one C call, nothing read per call
        self.one_live = None         # or: the one Live argument's index among the tensors
        if not INTERPRET and internals_problem() is None:
            self._build_fast(tensors)

    def _resolve(self, tensors) -> list:
        args = list(self.args)
        for pos, index in self.live:
            view = self.views.get(pos)
            args[pos] = tensors[index] if view is None else view.value(tensors)
        return args

    def _build_fast(self, tensors) -> None:
        import triton.knobs
        from triton.runtime import driver
        values, options = _bind(self.kernel, self._resolve(tensors), self.kwargs)
        compiled = self.kernel.warmup(*values, grid=self.grid, **options)
        launcher = compiled.run                       # loads the module on first use
        self.scratch = None
        if launcher.profile_scratch_size:
            # profiling scratch (instrumented kernels): allocated per launch by
            # CudaLauncher.__call__, whose allocator the profiler owns
            self.fast = launcher
            self.prefix = (compiled.function, compiled.packed_metadata, None, None, None)
        else:
            self.fast = launcher.launch
            self.prefix = (compiled.function, launcher.launch_cooperative_grid,
                           launcher.launch_pdl, None, None, compiled.packed_metadata, None,
                           None, None)
            if launcher.global_scratch_size:
                # global scratch (e.g. in-kernel TMA descriptors): CudaLauncher.__call__
                # asks Triton's allocator for grid * num_ctas * size bytes at every launch;
                # a Launch keeps one buffer per stream instead (see _launch_scratch)
                self.scratch = {}
        self.packed = tuple(v.data_ptr() if isinstance(v, torch.Tensor) else v for v in values)
        self.tail = self.prefix + self.packed
        self.keep = not_the_calls(values, tensors)
        self.compiled, self.args = compiled, None     # addresses only from here on
        self.device = driver.active.get_current_device()
        self.stream = driver.active.get_current_stream
        self.hooks = triton.knobs.runtime
        self.capturing = torch.cuda.is_current_stream_capturing
        self.torch_device = torch.device("cuda", self.device)
        self.direct = not self.live and self.scratch is None
        if len(self.live) == 1 and self.scratch is None:
            # one Live argument (a fresh output): packed as head, the pointer, rest
            pos, self.one_live = self.live[0]
            self.head, self.rest = self.prefix + self.packed[:pos], self.packed[pos + 1:]

    def __call__(self, tensors: tuple = ()) -> None:
        if self.direct and not self.hooks.launch_enter_hook.calls:
            # the hot path: one C call
            self.fast(*self.grid, self.stream(self.device), *self.tail)
        elif self.one_live is not None and not self.hooks.launch_enter_hook.calls:
            self.fast(*self.grid, self.stream(self.device), *self.head,
                      tensors[self.one_live].data_ptr(), *self.rest)
        elif self.fast is None:
            self.kernel[self.grid](*self._resolve(tensors), **self.kwargs)
        else:
            self._launch_slower(tensors)

    def _launch_slower(self, tensors) -> None:
        """Live arguments to read, global scratch to pass, or a launch hook (a profiler such
        as proton) to call."""
        if self.live:
            args = list(self.packed)
            for pos, index in self.live:
                args[pos] = tensors[index].data_ptr()
        else:
            args = self.packed
        if self.hooks.launch_enter_hook.calls:
            self.compiled[self.grid](*args)         # allocates scratch per launch itself
        elif self.scratch is not None:
            self._launch_scratch(args)
        else:
            self.fast(*self.grid, self.stream(self.device), *self.prefix, *args)

    def _launch_scratch(self, args) -> None:
        """A kernel with global scratch, through a buffer the Launch keeps per stream.

        Launches on one stream run in order, so one buffer per stream is never used by two
        launches at once; the caching allocator reuses its memory, once the Launch is gone,
        only after that stream's work (kept_buffer: never from a CUDA-graph pool). During a
        CUDA-graph capture the scratch is allocated per launch as Triton does (from the
        graph's pool, which lives as long as the graph): a buffer of the Launch's could be
        freed with its plan (ctx.reset, free, eviction) while the graph still replays."""
        stream = self.stream(self.device)
        if self.capturing():
            launcher = self.compiled.run
            launcher(*self.grid, stream, self.compiled.function, self.compiled.packed_metadata,
                     None, None, None, *args)
            return
        entry = self.scratch.get(stream)
        ptr = (entry or self._new_scratch(stream))[0]
        f, coop, pdl, _, _, meta, lm, eh, xh = self.prefix
        self.fast(*self.grid, stream, f, coop, pdl, ptr, None, meta, lm, eh, xh, *args)

    def _new_scratch(self, stream: int) -> tuple:
        launcher = self.compiled.run
        gx, gy, gz = self.grid
        size = gx * gy * gz * launcher.num_ctas * launcher.global_scratch_size
        align = max(1, launcher.global_scratch_align)
        buf = kept_buffer(size + align, self.torch_device)
        entry = self.scratch[stream] = (-(-buf.data_ptr() // align) * align, buf)
        return entry


def kept_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    """A buffer kept past the call (by a Launch) for work on the current stream, made
    outside every CUDA-graph pool (graph_pools.outside_graph_pools: a thread of trident's
    own, which no pool routing matches; the current stream recorded as its user). Made
    once per Launch and stream, off the warm path. (A stream of trident's own on the
    calling thread is not enough since torch 2.8: its allocations are routed too; seen on
    one H100, torch 2.11, tests/torch_ops/test_capture_all.py, "Detected 1 tensor(s) in
    the cudagraph pool not tracked as outputs".)"""
    return outside_graph_pools(device, "a launch's global scratch",
                               lambda: torch.empty(nbytes, dtype=torch.uint8, device=device))
