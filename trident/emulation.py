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

The other two hazards are handled elsewhere: programs run one after another (kernels
follow the lower-program-id rule, see trident.language), and inline PTX does not exist
(trident.language picks its CPU helpers at import time).
"""
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
    executor._init_args_hst = _init_args_hst
    executor._restore_args_dev = _restore_args_dev
    # The race detector (TRIDENT_SANITIZE=1) hooks the interpreter's memory ops and grid
    # loop; nothing of it is installed when it is off.
    from . import sanitize
    if sanitize.requested():
        sanitize.install_auto()
    _installed = True
