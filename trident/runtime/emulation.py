"""What the CPU emulation changes in the Triton interpreter, in one place.

The interpreter copies each tensor argument's whole storage to a host copy before a
launch and copies it back afterwards. For a tensor on the shared heap the "copy" is the
heap itself, and the copy-back rewrites the whole heap with what this process read at
launch time -- erasing every store a peer made meanwhile (and costing a heap-sized
memcpy per launch). CPU tensors need no host copy at all, so for them the arguments are
passed through untouched. GPU tensors keep the interpreter's own behaviour.

Also: scalar arguments are 1-element arrays there, and `range(n)` over one needs an
`__index__` that NumPy >= 2.4 still accepts.

`tl.multiple_of(x, n)` is checked: on a GPU it is a promise the compiler builds 16-byte
vector accesses on, and a false one is a "misaligned address" crash there; in the
interpreter it was a no-op, so a false hint passed every CPU test. Here every value of x
(an address in bytes, or an integer) must be a multiple of n, else AssertionError names
the values.

Gluon kernels (trident/language/gluon.py `jit`) run here too: `gluon_kernel` hands the
kernel's Python function to the interpreter, and while a kernel whose module uses
`triton.experimental.gluon.language` runs, Gluon's operations are mapped onto the
interpreter's (`_patch_gluon`): those Gluon shares with `triton.language` (load, store,
atomics, program_id, multiple_of, ...) become the interpreter's own, and the few that take
a layout (arange, full, convert_layout, thread_barrier) drop it -- one program is one
Python thread, so layouts place nothing. Shared memory, TMA, mbarriers and warp
specialisation are not mapped: a kernel that uses them raises NotImplementedError here.

The other two hazards are handled elsewhere: programs run one after another (kernels
follow the lower-program-id rule, see trident.language), and inline PTX does not exist
(trident.language picks its CPU helpers at import time).
"""
import types

from triton.runtime import interpreter as _interp

_installed = False


def _all_on_cpu(values) -> bool:
    for v in values:
        if isinstance(v, tuple):
            if not _all_on_cpu(v):
                return False
        elif hasattr(v, "data_ptr") and hasattr(v, "device") and v.device.type != "cpu":
            return False
    return True


def check_multiple_of(input, values) -> None:
    """Raise AssertionError unless `input` (a tensor in the interpreter) is a multiple of
    `values`: a scalar exactly; a block at its first element (Triton's divisibility is
    that of the first element of each run of contiguous elements, and the runs are not
    known here)."""
    import numpy as np
    import triton.language as tl
    if not isinstance(input, tl.tensor):
        return
    values = values if isinstance(values, (list, tuple)) else [values]
    values = [int(v.value if isinstance(v, tl.constexpr) else v) for v in values]
    data = np.asarray(input.handle.data)
    if data.dtype.kind not in "iu" or not data.size:
        return
    divisor = values[-1]                                  # innermost dimension's hint
    first = int(data.reshape(-1)[0])
    assert first % divisor == 0, (f"tl.multiple_of({divisor}) is false: {first} is not a "
                                  f"multiple of it (on a GPU: misaligned vector accesses)")


def install() -> None:
    """Make the interpreter pass CPU tensor arguments by reference (idempotent)."""
    global _installed
    if _installed:
        return
    executor = _interp.GridExecutor
    original_init, original_restore = executor._init_args_hst, executor._restore_args_dev

    def _init_args_hst(self, args_dev, kwargs):
        if _all_on_cpu(args_dev) and _all_on_cpu(kwargs.values()):
            return list(args_dev), dict(kwargs)
        return original_init(self, args_dev, kwargs)

    def _restore_args_dev(self, args_dev, args_hst, kwargs, kwargs_hst):
        passed_through = all(a is b for a, b in zip(args_dev, args_hst)) and all(
            kwargs[k] is kwargs_hst[k] for k in kwargs)
        if not passed_through:
            original_restore(self, args_dev, args_hst, kwargs, kwargs_hst)

    # Scalars are 1-element arrays in the interpreter; NumPy >= 2.4 refuses int() of those,
    # which breaks `range(n)` over a kernel argument. Index through .item() instead.
    original_patch_tensor = _interp._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        original_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    _interp._patch_lang_tensor = _patch_lang_tensor
    original_patch_core = _interp._patch_lang_core

    def _patch_lang_core(lang, scope):
        original_patch_core(lang, scope)
        hint = getattr(lang, "multiple_of")

        def multiple_of(input, values, **kwargs):
            check_multiple_of(input, values)
            return hint(input, values, **kwargs)
        scope.set_attr(lang, "multiple_of", multiple_of)

    _interp._patch_lang_core = _patch_lang_core
    original_patch_lang = _interp._patch_lang

    def _patch_lang(fn):
        gl = _gluon_language()
        if not any(v is gl for v in fn.__globals__.values()):
            return original_patch_lang(fn)
        # a Gluon kernel's module may not import triton.language: patch it all the same
        import triton.language as tl
        scope = original_patch_lang(types.SimpleNamespace(__globals__={"tl": tl}))
        _patch_gluon(gl, tl, scope)
        return scope

    _interp._patch_lang = _patch_lang
    _skip_repatching_in_device_calls()
    executor._init_args_hst = _init_args_hst
    executor._restore_args_dev = _restore_args_dev
    # The race detector (TRIDENT_SANITIZE=1, trident/sanitize/) hooks the interpreter's
    # memory ops and grid loop when a Context switches it on; nothing of it is installed
    # here.
    _installed = True


def _languages(fn) -> frozenset:
    """The language modules a launch of `fn` patches (the interpreter's _patch_lang):
    triton.language and triton.language.core where its module holds them; a Gluon
    kernel's: triton.language and Gluon's (see install)."""
    import triton.language as tl
    gl = _gluon_language()
    found = {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core or v is gl}
    return frozenset(found | {id(tl)} if id(gl) in found else found)


def _skip_repatching_in_device_calls() -> None:
    """A @triton.jit function called from a kernel (a device call: the interpreter's
    InterpretedFunction.__call__) patches the language again, although the launch under
    way patched the same modules and keeps them patched until it ends: inspect.getmembers
    over triton.language and a new wrapper per builtin, every call. A kernel that polls a
    flag through a helper paid it per poll: 30 % of the CPU time of the world-4
    all_reduce_add_rmsnorm tests (py-spy). Here a device call whose module's languages the
    launch under way already patched runs without patching; any other patches as before.
    Launches are told from device calls by who patches: GridExecutor (and the race
    detector's copy of its call) patch once per launch and restore at its end; a device
    call that patched a module the launch did not (triton.language.core, for Triton's own
    helpers such as tl.cdiv) leaves it patched until the launch ends (the interpreter
    never restores a device call's patch), so later calls skip it too."""
    original_patch_lang = _interp._patch_lang
    original_device_call = _interp.InterpretedFunction.__call__
    launches: list = []           # per launch under way: the languages its patch covers
    in_device_call = [0]
    known: dict = {}              # fn -> _languages(fn)

    def languages(fn):
        langs = known.get(fn)
        if langs is None:
            langs = known[fn] = _languages(fn)
        return langs

    def _patch_lang(fn):
        scope = original_patch_lang(fn)
        if not in_device_call[0]:                     # a launch's: restored at its end
            launches.append(set(languages(fn)))
            restore = scope.restore

            def restore_launch():
                try:
                    restore()
                finally:
                    launches.pop()
            scope.restore = restore_launch
        return scope

    def device_call(self, *args, **kwargs):
        if launches and languages(self.fn) <= launches[-1]:
            fn = self.rewrite()
            try:
                return fn(*args, **kwargs)
            except Exception as e:          # as the interpreter's own device call
                raise _interp.InterpreterError(repr(e)) from e
        in_device_call[0] += 1
        try:
            return original_device_call(self, *args, **kwargs)
        finally:
            in_device_call[0] -= 1
            if launches:        # what it patched stays so until the launch ends (never
                launches[-1] |= languages(self.fn)    # restored: the interpreter's way)

    _interp._patch_lang = _patch_lang
    _interp.InterpretedFunction.__call__ = device_call


def _gluon_language():
    from triton.experimental.gluon import language
    return language


class _GluonKernel(_interp.InterpretedFunction):
    """A Gluon kernel run by the interpreter. The interpreter finds constexpr parameters by
    their annotation as written ("tl.constexpr"); "gl.constexpr" is the same class."""

    def rewrite(self):
        fn = super().rewrite()
        fn.__annotations__ = {k: "constexpr" if isinstance(v, str) and v.endswith(".constexpr")
                              else v for k, v in fn.__annotations__.items()}
        return fn

    def run(self, *args, **kwargs):
        install()           # Gluon's mapping (idempotent; a Context installs it too)
        return super().run(*args, **kwargs)


def gluon_kernel(fn):
    """A Gluon kernel's function as the interpreter runs it (`kernel[grid](...)` works as for
    a @triton.jit kernel under TRITON_INTERPRET=1)."""
    return _GluonKernel(fn)


def _no_layout(name):
    """Gluon's `name`, which takes a layout, as the interpreter's op of that name without it."""
    import triton.language as tl
    if name == "arange":
        return lambda start, end, layout=None: tl.arange(start, end)
    if name == "full":
        return lambda shape, value, dtype, layout=None: tl.full(shape, value, dtype)
    if name == "thread_barrier":
        return lambda: tl.debug_barrier()
    return lambda value, layout=None, assert_trivial=False: value    # convert/set layout


_LAYOUT_OPS = ("arange", "full", "thread_barrier", "convert_layout", "set_auto_layout")


def _unmapped(name):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"gl.{name} does not run on the CPU emulation: trident/runtime/emulation.py maps only "
            f"Gluon's operations on registers and global memory (layouts as no-ops)")
    return op


def _patch_gluon(gl, tl, scope) -> None:
    """Map Gluon's builtins onto the (already patched) interpreter ones, in `scope`."""
    for name in dir(gl):
        member = getattr(gl, name)
        if not getattr(member, "__triton_builtin__", False) or isinstance(member, type):
            continue
        if name in _LAYOUT_OPS:
            scope.set_attr(gl, name, _no_layout(name))
        elif getattr(tl, name, None) or getattr(tl.math, name, None):
            scope.set_attr(gl, name, getattr(tl, name, None) or getattr(tl.math, name))
        else:
            scope.set_attr(gl, name, _unmapped(name))
    # Gluon's library functions written in Gluon (cdiv, sum, zeros, ...) are interpreted
    from triton.runtime.jit import JITFunction
    for name in dir(gl):
        member = getattr(gl, name)
        if isinstance(member, JITFunction):
            scope.set_attr(gl, name, _interp.InterpretedFunction(member.fn))
    scope.set_attr(gl, "static_range", tl.static_range)
