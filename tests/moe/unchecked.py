"""ExpertParallel objects made past the constructor's agreement on its arguments
(trident/moe/expert_parallel.py `agree_args`), which refuses arguments that differ between
ranks: tests of the kernels' own guard against such ranks (the fingerprint) use this to
reach it."""
import contextlib

from trident.moe import expert_parallel


@contextlib.contextmanager
def arguments_unchecked():
    """Inside the block, ExpertParallel(...) does not compare its arguments across ranks
    (this process only; restored on exit)."""
    agree, expert_parallel.agree_args = expert_parallel.agree_args, lambda ctx, **kw: None
    try:
        yield
    finally:
        expert_parallel.agree_args = agree
