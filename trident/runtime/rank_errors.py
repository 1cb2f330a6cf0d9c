"""What a rank process reports of an error to the launcher (trident/runtime/launch.py), and
which of the ranks' errors the launcher raises: a root cause before the timeouts it causes
on the other ranks."""
from __future__ import annotations

import pickle
import traceback

from .errors import CommTimeout

# what the ranks' falling out of step raises: a consequence of an error elsewhere
_OUT_OF_STEP = (CommTimeout,)     # CallMismatch, PeerFailed, HostTimeout... too


def handled_cause(exc: BaseException) -> BaseException | None:
    """The error an out-of-step error (a timeout, a call mismatch) was raised while
    handling, if any: a rank that fails and then meets its peers in a collective during
    cleanup (a `finally` that closes or frees) gets one there, and its first error is what
    went wrong. Walks exc's __context__ chain for the deepest error that is not out of
    step itself and was not translated into its successor (`raise ... from None`, as
    HostTimeout does with the transport's RuntimeError)."""
    if not isinstance(exc, _OUT_OF_STEP):
        return None
    cause, seen = None, set()
    while exc.__context__ is not None and id(exc) not in seen:
        seen.add(id(exc))
        inner = exc.__context__
        if not isinstance(inner, _OUT_OF_STEP) and not exc.__suppress_context__:
            cause = inner
        exc = inner
    return cause


def pack_error(exc: BaseException) -> tuple[bytes | None, str, str, int]:
    """(the pickled exception or None, its one-line summary, its traceback, its rank as a
    cause: 0 a root cause, 1 a device wait that timed out (names the peer it waited for),
    2 a host collective that timed out (a consequence of something else)). An error raised
    while handling another (handled_cause) names that one and ranks 0."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    summary = f"{type(exc).__name__}: {exc}"
    level = 0 if not isinstance(exc, CommTimeout) else 2 if exc.peer is None else 1
    cause = handled_cause(exc)
    if cause is not None:
        first = f"{type(cause).__name__}: {cause}"
        summary += f" [while handling {first}]"
        tb = f"(this rank first raised {first}; the error below came while handling it)\n{tb}"
        level = 0
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:
        blob = None
    return blob, summary, tb, level


def exit_status(code) -> str:
    """'exit code 1', or 'killed by SIGKILL' for a negative code."""
    if code is not None and code < 0:
        import signal
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"


def first_error(errors: list, what: str, world_size: int) -> BaseException:
    """The exception to raise for the ranks' reported `errors` ((time, rank, pack_error's
    tuple) each) of request `what`: the first root cause (else the first timeout), with its
    rank's traceback and every other rank's summary as notes."""
    errors = sorted(errors, key=lambda e: (e[2][3], e[0]))
    _, rank, (blob, summary, tb, _) = errors[0]
    exc = pickle.loads(blob) if blob is not None else RuntimeError(summary)
    exc.add_note(f"(raised on rank {rank} of {world_size} while it ran {what}; "
                 f"traceback there:)\n{tb}")
    for _, other, (_, text, _, _) in sorted(errors[1:], key=lambda e: e[1]):
        exc.add_note(f"rank {other} failed too: {text}")
    return exc
