"""Context's op facade: ctx.all_reduce(...), ctx.all_gather_matmul(...), ctx.trace(...)
and the rest hand over to trident.ccl, trident.ops and trident.trace, imported on first
use (`trident.init` stays light, and those packages may take the context as an argument
without importing trident.context).

Part of trident.Context (trident/context.py), which inherits OpMethods."""
from __future__ import annotations

from ..runtime.compiled import is_compiling


def _ccl():
    """trident.ccl, imported on first use (an import statement per call costs ~0.5 us)."""
    global _ccl_module
    if _ccl_module is None:
        from .. import ccl
        _ccl_module = ccl
    return _ccl_module


def _ops():
    global _ops_module
    if _ops_module is None:
        from .. import ops
        _ops_module = ops
    return _ops_module


_ccl_module = _ops_module = None


def _bound(name: str):
    """trident.ccl's entry `name` (a function of (ctx, ...)), put on OpMethods in place of
    the method that asked for it, so that from then on `ctx.all_reduce(t)` calls
    ccl.all_reduce(ctx, t) itself: the warm path of a collective is host-bound, and this
    layer cost it a Python frame and the re-packing of its keyword options (~0.3 us on a
    CPU core). Same signature and defaults as the method (ccl's docstring then). Not
    while torch.compile traces the call: ccl's entry picks its stand-in then (runtime/compiled.py),
    and the class is left as it is."""
    fn = getattr(_ccl(), name)
    if not is_compiling():
        setattr(OpMethods, name, fn)
    return fn


class _Building:
    def __init__(self, ctx, name):
        self.ctx, self.name = ctx, name

    def __enter__(self):
        self.prev, self.ctx._calling = self.ctx._calling, self.name
        self.exchanges = self.ctx._exchanges

    def __exit__(self, kind, exc, tb):
        self.ctx._calling = self.prev
        if exc is not None and not isinstance(exc, KeyboardInterrupt) \
                and not self.ctx.handed_over(exc):
            # this rank will not launch the call: peers already waiting in it for this
            # rank stop at once and name this error (trident/context_sync.py)
            self.ctx._publish(exc)
            if self.ctx._exchanges == self.exchanges:
                # ... also peers waiting in a host exchange of it (its first call's
                # workspace), which this rank never made
                self.ctx.post_failure(self.name, exc)


class OpMethods:
    """The collectives, fused ops, tracing and the device barrier of trident.Context."""

    # ------------------------------------------------------------------ collectives
    # Each method hands over to its package (imported on first use); see docs/design.md.
    # The five collectives' first call puts ccl's entry in its place (`_bound`).
    def building(self, name: str):
        """Context manager around a plan's build: names the op in the errors of the host
        collectives it makes (a workspace that does not fit, a rank that skipped the op's
        first call), and publishes an error the build raises to the peers. Only builds pay
        for it; a warm call does not."""
        return _Building(self, name)

    def all_gather(self, out, inp, **options):
        """out [world*n, ...] = concatenation of every rank's inp [n, ...]."""
        return _bound("all_gather")(self, out, inp, **options)

    def reduce_scatter(self, out, inp, op: str = "sum", **options):
        """out [n, ...] = this rank's block of the sum over ranks of inp [world*n, ...]."""
        return _bound("reduce_scatter")(self, out, inp, op, **options)

    def all_reduce(self, t, op: str = "sum", **options):
        """In place: t = reduction of t over ranks; returns t."""
        return _bound("all_reduce")(self, t, op, **options)

    def all_to_all(self, out, inp, out_splits=None, in_splits=None, **options):
        """Rank r sends rows in_splits[p] of inp to rank p and receives out_splits[p] rows
        from rank p into out, in rank order (None: even splits)."""
        return _bound("all_to_all")(self, out, inp, out_splits, in_splits, **options)

    def broadcast(self, t, src: int = 0, **options):
        """t on every rank = t of rank `src`; returns t."""
        return _bound("broadcast")(self, t, src, **options)

    def all_reduce_add_rmsnorm(self, x, residual, weight, eps: float = 1e-6, **options):
        """Fused: residual += all_reduce_sum(x) (in place); returns
        rmsnorm(residual) * weight, one kernel (trident/ccl/add_rmsnorm.py)."""
        return _ccl().all_reduce_add_rmsnorm(self, x, residual, weight, eps, **options)

    # ------------------------------------------------------------------ fused ops
    def all_gather_matmul(self, a, w, bias=None, **options):
        """all_gather(a, dim 0) @ w.T + bias (column-parallel linear)."""
        return _ops().all_gather_matmul(self, a, w, bias, **options)

    def matmul_reduce_scatter(self, a, w, bias=None, **options):
        """reduce_scatter(a @ w.T, dim 0) + bias (row-parallel linear)."""
        return _ops().matmul_reduce_scatter(self, a, w, bias, **options)

    def matmul_all_reduce(self, a, w, bias=None, **options):
        """all_reduce(a @ w.T) + bias (row-parallel linear)."""
        return _ops().matmul_all_reduce(self, a, w, bias, **options)

    def matmul_all_reduce_add_rmsnorm(self, a, w, residual, norm_weight, eps: float = 1e-6,
                                      **options):
        """Row-parallel linear + all-reduce + residual add + RMSNorm, the communication of
        a decode TP layer: `y, res = ctx.matmul_all_reduce_add_rmsnorm(a, w, residual,
        norm_weight, eps)` with res = all_reduce(a @ w.T) + bias + residual and y =
        rmsnorm(res) * norm_weight. Options: bias, out, residual_out (residual itself: add
        in place), schedule ("auto", "fused": one kernel for M <= 256, "sequential"),
        config, matmul_schedule (trident/ops/matmul_all_reduce_add_rmsnorm.py)."""
        return _ops().matmul_all_reduce_add_rmsnorm(self, a, w, residual, norm_weight, eps,
                                                    **options)

    # ------------------------------------------------------------------ tracing
    def trace(self, path: str | None = None, **options):
        """Context manager: record device-side events of the ops inside it, then write
        one Chrome/Perfetto trace merged across ranks."""
        from .. import trace
        return trace.session(self, path, **options)

    # ------------------------------------------------------------------ device barrier
    def device_barrier(self) -> None:
        """Stream-ordered barrier across ranks (one tiny kernel; CUDA-graph capturable).
        Like every op, it raises at once after a failed call (no launch plan checks it)."""
        from ..ccl.barrier import device_barrier
        self.raise_if_failed("device_barrier")
        device_barrier(self)
        self.after_op()


# the methods `_bound` replaces, as they were (a test compiles a first call through them)
UNBOUND = {name: OpMethods.__dict__[name]
           for name in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast")}
