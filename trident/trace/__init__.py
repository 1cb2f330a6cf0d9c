"""Intra-kernel tracing: device events -> one Chrome/Perfetto JSON merged across ranks.

Kernels take two extra arguments, `trace_buf` and `TRACE: tl.constexpr`, obtained on the
host from `kernel_args(ctx)`, and record phases with trident.trace.device.begin/end.
"""


def kernel_args(ctx):
    """(buffer, enabled) to pass as a kernel's trace_buf and TRACE arguments."""
    buf = getattr(ctx, "_trace_buffer", None)
    if buf is None:
        return ctx.ctrl, False          # any int64 tensor: never touched when TRACE is off
    return buf, True


def session(ctx, path=None, **options):
    from .session import TraceSession
    return TraceSession(ctx, path, **options)
