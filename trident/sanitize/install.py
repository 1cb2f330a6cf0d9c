"""Switching the race detector on and off (see trident/sanitize/__init__.py): the
interpreter's memory ops and grid loop patched to one rank's Sanitizer, and Context's
sync, host_exchange and close wrapped to call it."""
from __future__ import annotations

import functools
import inspect
import os
import random
import uuid

from ..runtime import options
from .log import MAX_PROGRAMS, _Bank
from .sanitizer import Sanitizer, _builder

ENV = "TRIDENT_SANITIZE"


def requested() -> bool:
    """TRIDENT_SANITIZE now (a context reads it once: ctx.options.sanitize)."""
    return options.get(ENV)


_active: Sanitizer | None = None
_orig: dict = {}


def _install(san: Sanitizer) -> None:
    global _active
    from triton.runtime import interpreter as _interp

    from ..language import _cpu
    b = _builder()
    for name, hook in (("create_masked_load", san.on_load), ("create_masked_store", san.on_store),
                       ("create_atomic_rmw", san.on_atomic_rmw),
                       ("create_atomic_cas", san.on_atomic_cas)):
        orig = _orig.setdefault(name, getattr(type(b), name).__get__(b))
        setattr(b, name, functools.partial(hook, orig))
    _orig.setdefault("call", _interp.GridExecutor.__call__)
    _interp.GridExecutor.__call__ = _sanitized_call
    _cpu.yield_hook = san.switch
    _active = san


def _uninstall() -> None:
    global _active
    from triton.runtime import interpreter as _interp

    from ..language import _cpu
    b = _builder()
    for name in ("create_masked_load", "create_masked_store", "create_atomic_rmw",
                 "create_atomic_cas"):
        b.__dict__.pop(name, None)
    if "call" in _orig:
        _interp.GridExecutor.__call__ = _orig["call"]
    _cpu.yield_hook = None
    _active = None


def _sanitized_call(self, *args_dev, **kwargs):
    """GridExecutor.__call__ of Triton 3.6 with the grid loop replaced by Sanitizer.run_grid."""
    from triton.runtime import interpreter as _interp
    san = _active
    if san is None:
        return _orig["call"](self, *args_dev, **kwargs)
    argspec = inspect.getfullargspec(self.fn)
    kwargs = {k: v for k, v in kwargs.items() if k in argspec.args}
    args_hst, kwargs_hst = self._init_args_hst(args_dev, kwargs)
    for hook in self.pre_run_hooks:
        hook(*args_hst, **kwargs_hst)
    patch_scope = _interp._patch_lang(self.fn)
    try:
        args = inspect.getcallargs(self.fn, *args_hst, **kwargs_hst)
        args = {name: arg if name in self.constexprs else _interp._implicit_cvt(arg)
                for name, arg in args.items()}
        grid = self.grid(args) if callable(self.grid) else self.grid
        grid = tuple(grid) + (1,) * (3 - len(grid))
        _interp.interpreter_builder.set_grid_dim(*grid)
        san.run_grid(self.fn, args, grid)
    finally:
        patch_scope.restore()
    self._restore_args_dev(args_dev, args_hst, kwargs, kwargs_hst)


def _wrap_context(cls) -> None:
    """Have cls.sync, host_exchange and close (cls: trident.Context, passed in so that this
    module does not import trident.runtime.context) call the sanitizer of a context that has one
    (and, with TRIDENT_SANITIZE=1, switch it on at the context's first host collective:
    the barrier that ends trident.init). Done once per class, on first use."""
    if getattr(cls, "_sanitize_wrapped", False):
        return
    sync, exchange, close = cls.sync, cls.host_exchange, cls.close

    def sync_(self):
        san = getattr(self, "_sanitizer", None)
        if san is None:
            return sync(self)
        try:
            sync(self)
        finally:      # also after a timeout here: the peers are in the same sync
            san.on_sync(functools.partial(exchange, self))

    def host_exchange_(self, what, *args, **kwargs):
        result = exchange(self, what, *args, **kwargs)
        san = getattr(self, "_sanitizer", None)
        if san is not None:
            san.on_host_collective(what)
        elif (self.options.sanitize and not getattr(self, "_sanitize_auto", False)
              and self.backend == "cpu"):
            self._sanitize_auto = True
            enable(self)
        return result

    def close_(self):
        try:
            close(self)
        finally:
            if getattr(self, "_sanitizer", None) is not None:
                disable(self)

    functools.update_wrapper(sync_, sync)
    functools.update_wrapper(host_exchange_, exchange)
    functools.update_wrapper(close_, close)
    cls.sync, cls.host_exchange, cls.close = sync_, host_exchange_, close_
    cls._sanitize_wrapped = True


def install_auto(cls) -> None:
    """Called by trident.Context (`cls`) when TRIDENT_SANITIZE=1: every context switches
    the sanitizer on when trident.init ends."""
    _wrap_context(cls)


def enable(ctx, seed: int | None = None) -> Sanitizer:
    """Collective: switch the sanitizer on for `ctx` (CPU emulation only). `seed` fixes the
    schedule (default: TRIDENT_SANITIZE_SEED, else a random one, shown in reports)."""
    import torch.distributed as dist

    from ..runtime.heap.cpu import SHM_DIR, _libc, _map
    if ctx.backend != "cpu":
        raise RuntimeError("the trident sanitizer runs on the CPU emulation only "
                           "(TRITON_INTERPRET=1 / TRIDENT_BACKEND=cpu)")
    if getattr(ctx, "_sanitizer", None) is not None:
        return ctx._sanitizer
    if _active is not None:
        raise RuntimeError("the trident sanitizer is already on for another context of this "
                           "process")
    if seed is None:
        seed = ctx.options.sanitize_seed
    info = [(uuid.uuid4().hex[:8], random.randrange(1 << 31) if seed is None else seed)]
    dist.broadcast_object_list(info, src=dist.get_global_rank(ctx.group, 0), group=ctx.group)
    nonce, seed = info[0]
    job = ctx.options.job_id or "nojob"
    comps = ctx.world_size * MAX_PROGRAMS
    size = 2 * _Bank.nbytes(comps)
    size += -size % 4096

    def path(r):
        return os.path.join(SHM_DIR, f"trident-{job}-sanitize-{nonce}-{r}")
    fd = os.open(path(ctx.rank), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    addrs = []
    try:
        dist.barrier(ctx.group)
        addrs = [_map(path(r), size) for r in range(ctx.world_size)]
        san = Sanitizer(ctx, addrs, size, seed)
        dist.barrier(ctx.group)          # every rank holds every mapping, banks initialised
    except BaseException:
        for a in addrs:
            _libc.munmap(a, size)
        raise
    finally:
        os.unlink(path(ctx.rank))
    _wrap_context(type(ctx))
    ctx._sanitizer = san
    _install(san)
    return san


def disable(ctx) -> None:
    """Switch the sanitizer off for `ctx` (local; pending races are not checked)."""
    from ..runtime.heap.cpu import _libc
    san = getattr(ctx, "_sanitizer", None)
    if san is None:
        return
    _uninstall()
    ctx._sanitizer = None
    san.banks = None
    for a in san._addrs:
        _libc.munmap(a, san._size)


class sanitizing:
    """`with sanitizing(ctx, seed):` -- the sanitizer on inside the block (collective at
    entry). The block should end with ctx.barrier() so that races are checked."""

    def __init__(self, ctx, seed: int | None = None):
        self.ctx, self.seed = ctx, seed

    def __enter__(self):
        return enable(self.ctx, self.seed)

    def __exit__(self, *exc):
        disable(self.ctx)
