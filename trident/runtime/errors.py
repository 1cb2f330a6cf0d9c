"""Errors trident raises, and the op codes that device waits record when they time out."""

import dataclasses

# Each kernel that waits passes one of these codes to `wait`, so that a timeout can be
# reported by name on the host. Append only: the codes travel between ranks.
OP_NAMES = {
    0: "wait",
    1: "device_barrier",
    2: "all_gather",
    3: "reduce_scatter",
    4: "all_reduce",
    5: "all_to_all",
    6: "broadcast",
    7: "all_gather_matmul",
    8: "matmul_reduce_scatter",
    9: "matmul_all_reduce",
    10: "moe_dispatch",
    11: "moe_combine",
    12: "test",
    13: "p2p_bench",
    14: "matmul_all_reduce_add_rmsnorm",
    15: "all_reduce_add_rmsnorm",
}
OP_CODES = {name: code for code, name in OP_NAMES.items()}

ERROR_FLAG = 1 << 62


def encode_timeout(op: int, rank: int, peer: int) -> int:
    """The value a timed-out wait writes into the error word (see language/sync.py)."""
    return ERROR_FLAG | (op << 32) | (rank << 16) | peer


def decode_timeout(word: int) -> tuple[str, int, int]:
    op = (word >> 32) & 0xFFFF
    return OP_NAMES.get(op, f"op#{op}"), (word >> 16) & 0xFFFF, word & 0xFFFF


# What a failed device wait found (bits 48..55 of the error word; language/sync.py KIND_*)
KIND_TIMEOUT, KIND_PEER_FAILED, KIND_MISMATCH = 0, 1, 2
# ... or that the peer waited in a host-side call (HOST_CALLS) instead of this collective
KIND_HOST_CALL = 3
# The host-side calls a rank publishes while it waits in them, its device work finished
# (language/sync.py CTRL_HOST_CALL), by code. Append only: the codes travel between ranks.
HOST_CALLS = {1: "barrier", 2: "close", 3: "workspace", 4: "debug check",
              5: "destroy_process_group", 6: "fallback"}
HOST_CALL_CODES = {name: code for code, name in HOST_CALLS.items()}
# what the host stores in its error word when the rank failed outside a kernel (a heap that
# reset found different): the rank's waits then return at once
ERROR_MARK = ERROR_FLAG | (0xFF << 48)
# what the host stores in its error word's mirror alone (never the device's word) after it
# published an error its peers may not share: the next call first meets them
# (context_sync.py `_meet_peers`); a device error that follows overwrites it
ERROR_PUBLISHED = ERROR_FLAG | (0xFE << 48)


def device_error(word: int, timeout_s: float, message_of=None) -> "CommTimeout":
    """The exception for a nonzero error word: CommTimeout (the peer never signalled),
    PeerFailed (the peer had failed: `message_of(peer)` reads its message, if given) or
    CallMismatch (the peer's call differs from this rank's)."""
    op, rank, peer = decode_timeout(word)
    kind = (word >> 48) & 0xFF
    if kind == KIND_PEER_FAILED:
        return PeerFailed(op, rank, peer, message_of(peer) if message_of else "")
    if kind == KIND_MISMATCH:
        return CallMismatch(op, rank, peer)
    if kind == KIND_HOST_CALL:
        return CallMismatch(op, rank, peer,
                            "a host-side call: a barrier, close or a workspace's creation")
    return CommTimeout(op, rank, peer, timeout_s)


# Kinds of bad input values a kernel can record in the control block (language/sync.py:
# CTRL_VALUE_ERROR, then four argument words). Kernels drop such values; the host turns the
# record into a ValueError at the next ctx.sync() / ctx.barrier(). Append only.
VALUE_ERRORS = {
    1: "dispatch: topk_idx[{0}, {1}] = {2} is not an expert id in [0, {3})",
    2: "dispatch: token {0} lists expert {2} twice (topk_idx[{0}, {3}] and topk_idx[{0}, {1}])",
}
VALUE_ERROR_CODES = {"expert_id_out_of_range": 1, "expert_id_repeated": 2}


def value_error_message(kind: int, args: list[int], rank: int) -> str:
    """The message of a recorded bad value: the op's own words, then what was done with it."""
    text = VALUE_ERRORS.get(kind, "bad input value of kind #{} ({{}}, {{}}, {{}}, {{}})"
                            .format(kind)).format(*args)
    return f"{text} (on rank {rank}; the kernel dropped it and went on)"


class CommTimeout(RuntimeError):
    """A device-side wait ran past its limit: a peer never signalled.

    Raised on the host at the next synchronisation point (ctx.barrier(), ctx.sync(), or
    after every op when the context is in debug mode).
    """

    def __init__(self, op: str, rank: int, peer: int, timeout_s: float):
        self.op, self.rank, self.peer, self.timeout_s = op, rank, peer, timeout_s
        super().__init__(f"rank {rank}: {op} timed out after {timeout_s:g} s waiting for a signal "
                         f"from rank {peer} (did that rank skip or fail the same call, or run it "
                         f"with another algorithm=?)")

    def __reduce__(self):
        return CommTimeout, (self.op, self.rank, self.peer, self.timeout_s)


class HeapMismatchError(RuntimeError):
    """Ranks made different allocation requests on the symmetric heap."""


class HostTimeout(CommTimeout):
    """A host-side collective (barrier, workspace creation, debug check) did not hear from
    every rank within the context's timeout: a rank skipped the call, failed before it or
    died. The process group cannot be used afterwards. `missing`: the ranks that did not
    come, where they are known (`peer` stays None: no device wait named one, and the
    launcher ranks such an error as a consequence, runtime/rank_errors.py pack_error)."""

    def __init__(self, op: str, rank: int, timeout_s: float, detail: str = "",
                 missing: tuple = ()):
        self.op, self.rank, self.peer, self.timeout_s, self.detail = op, rank, None, timeout_s, detail
        self.missing = tuple(missing)
        who = (f"rank{'s' if len(self.missing) > 1 else ''} "
               f"{', '.join(map(str, self.missing))} did not join it"
               if self.missing else "another rank did not join it")
        RuntimeError.__init__(
            self, f"rank {rank}: {op} (a host-side collective) failed: {who} within "
                  f"{timeout_s:g} s (it skipped this call, failed before it or died)"
                  + (f" [transport: {detail}]" if detail else ""))

    def __reduce__(self):
        return HostTimeout, (self.op, self.rank, self.timeout_s, self.detail, self.missing)


class GroupUnusable(CommTimeout):
    """A host-side collective (or a step between nodes) was asked of a process group
    that failed earlier -- a HostTimeout or InterNodeError -- after which the group
    cannot be used again. The call fails at once rather than wait out another timeout;
    the job's processes must be started again."""

    def __init__(self, op: str, rank: int, earlier: str):
        self.op, self.rank, self.peer, self.timeout_s, self.earlier = op, rank, None, 0.0, earlier
        RuntimeError.__init__(
            self, f"rank {rank}: {op} was not attempted: {earlier} failed earlier on this "
                  f"rank, and its process group cannot be used after that. End the job's "
                  f"processes and start them again")

    def __reduce__(self):
        return GroupUnusable, (self.op, self.rank, self.earlier)


class InterNodeError(CommTimeout):
    """A step between nodes (a torch.distributed collective over a rail: one rank per
    node) failed: a rank of another node skipped the call, called another one, failed or
    died, and the transport gave up (its timeout is the context's host timeout) or lost
    the peer. The process groups cannot be used afterwards."""

    def __init__(self, op: str, rank: int, ranks: list, timeout_s: float, detail: str = ""):
        self.op, self.rank, self.peer, self.timeout_s = op, rank, None, timeout_s
        self.ranks, self.detail = list(ranks), detail
        RuntimeError.__init__(
            self, f"rank {rank}: {op}, the step between nodes over ranks {self.ranks}, failed: "
                  f"a rank of another node did not join it within {timeout_s:g} s (it "
                  f"skipped this call, made another, failed before it or died)"
                  + (f" [transport: {detail}]" if detail else ""))

    def __reduce__(self):
        return InterNodeError, (self.op, self.rank, self.ranks, self.timeout_s, self.detail)


@dataclasses.dataclass(frozen=True)
class Failure:
    """What a PeerFailed quotes of the rank that failed: the type name (`kind`) and the
    message of what rank `rank` raised, and the call that raised it (`call`, None where
    unknown). Kept as data, not text, so that a layer that numbers the ranks otherwise
    (a node's ranks within the world: trident/nodes) renumbers it with `on`; str() is what
    the errors show. It travels between ranks by pickle (the host exchanges' store, the
    launcher)."""

    kind: str
    rank: int
    message: str
    call: str | None = None

    @classmethod
    def of(cls, exc: BaseException, rank: int, call: str | None = None) -> "Failure":
        """The Failure of `exc`, raised on `rank` (by `call`); its message at most 2000
        characters, as every rank's copy of it is kept in the store."""
        return cls(type(exc).__name__, rank, str(exc)[:2000], call)

    def on(self, rank: int) -> "Failure":
        """The same failure, its rank numbered `rank`: the message is the error's own
        (ranks it names itself stay as they are: a check's words seldom name one)."""
        return dataclasses.replace(self, rank=rank)

    def __str__(self) -> str:
        what = f"{self.kind} on rank {self.rank}: {self.message}"
        return what if self.call is None else f"{self.call}, which raised {what}"


class PeerFailed(CommTimeout):
    """A device wait gave up because the rank it waited for had failed: that rank raised
    an error in this call (bad input, a heap that is full, ...) or an earlier one, or one
    of its own waits gave up. The message carries the peer's error where it is known:
    `cause`, a Failure (or text, or "" where unknown)."""

    def __init__(self, op: str, rank: int, peer: int, cause: "Failure | str" = ""):
        self.op, self.rank, self.peer, self.timeout_s, self.cause = op, rank, peer, 0.0, cause
        RuntimeError.__init__(
            self, f"rank {rank}: {op} stopped: rank {peer}, which it waited for, failed"
                  + (f" ({cause})" if cause else "")
                  + ". Outputs of this call are not valid; call ctx.reset() on every rank")

    def renumbered(self, rank_of, op: str | None = None) -> "PeerFailed":
        """This error with its ranks numbered otherwise: rank_of(r) for each rank r it
        names (this rank, the peer, the Failure's rank; a cause given as text is kept as
        it is), under `op` where given."""
        cause = self.cause
        if isinstance(cause, Failure):
            cause = cause.on(rank_of(cause.rank))
        return PeerFailed(self.op if op is None else op, rank_of(self.rank),
                          rank_of(self.peer), cause)

    def __reduce__(self):
        return PeerFailed, (self.op, self.rank, self.peer, self.cause)


class CallMismatch(CommTimeout):
    """Ranks made different calls at the same point: a size, dtype, reduction, algorithm
    or op that differs, found on the device (a fingerprint of the call travels with the
    signals peers wait on; `peer` is the rank of the pair), or a rank in another host-side
    call (a barrier, reset, close, an op's first call: found by the host exchange, whose
    `message` names each rank's call; `peer` is None). Every rank raises it."""

    def __init__(self, op: str, rank: int, peer: int | None, theirs: str = "",
                 message: str = ""):
        self.op, self.rank, self.peer, self.timeout_s, self.theirs = op, rank, peer, 0.0, theirs
        self.message = message
        RuntimeError.__init__(
            self, message or
            f"rank {rank}: {op}: rank {peer} made a different call at the same point "
            f"({theirs or 'another size, dtype, reduction, algorithm or op'}). Every "
            f"rank must make the same calls with the same sizes; outputs of this call "
            f"are not valid; call ctx.reset() on every rank")

    def __reduce__(self):
        return CallMismatch, (self.op, self.rank, self.peer, self.theirs, self.message)


# The name of host-side mismatches before issue 41: the same class now, so that one
# `except CallMismatch` (or `except td.CommTimeout`) catches both kinds.
CallMismatchError = CallMismatch
