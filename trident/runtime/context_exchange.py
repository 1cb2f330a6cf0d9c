"""Context's host header exchanges: the one host-side collective that barrier(), reset(),
a workspace's creation and debug mode's checks are all made of (host_exchange), numbered
alike on every rank; the one-sided posts of a rank that will not make an exchange its
peers may wait in (a call that failed before it, a reset), and reset's realignment of the
numbers (issue 41).

Part of the runtime's Context (context.py), which inherits ExchangeMethods; this module does not
import context.py."""
from __future__ import annotations

import datetime
import hashlib
import pickle
import uuid

import torch
import torch.distributed as dist

from .errors import CallMismatch, Failure, GroupUnusable, HostTimeout, PeerFailed

_GROUP_FAILED: dict = {}        # group -> the call in which it failed (unusable since)


def mark_failed(group, what: str) -> None:
    """Record that a collective over `group` failed (timed out, lost a peer): the group
    cannot be used again (errors.GroupUnusable). Any process group: a context's own (its
    host exchanges, below) as well as the rails between nodes (trident/nodes/rail.py)."""
    _GROUP_FAILED.setdefault(group, what)


def failed(group) -> str | None:
    """The call in which `group` failed, or None."""
    return _GROUP_FAILED.get(group)


def forget_failed(*groups) -> None:
    """Drop what is recorded of groups about to be destroyed."""
    for g in groups:
        _GROUP_FAILED.pop(g, None)


# Host-side collectives of a context (barrier, workspace creation, debug-mode agreement
# checks, reset) all begin with one all_gather of a header of this fixed size: which call
# it is (name, step number, a digest of its details) and a payload. Any two of them pair
# up, so ranks that made different calls find out from the headers and every rank raises
# an error that names each rank's call. They go through the group's store (keys of this
# context's own, `_exchange_store`), never through the group's collectives: a header
# exchange on one rank would otherwise pair with a torch.distributed collective of the
# same size on its peer (the "nccl" algorithm, the torch backend's fallbacks, the user's
# own), which returned the header to that peer as its data (issue 29).
_HEADER_MAGIC = 0x7472696465_6E74      # "trident"
_NAME_WORDS = 4                         # 32 bytes of the call's name
_PAYLOAD_WORDS = 9
_HEADER_WORDS = 3 + _NAME_WORDS + _PAYLOAD_WORDS
# Exchanges are numbered alike on every rank (`_exchanges`: exchange n's keys are "n/<rank>").
# A rank that will not make an exchange its peers may be waiting in posts its header alone
# and goes on ("one-sided"): an op whose build raised before any exchange (a bad input on
# that rank only: the peers' first call of the op creates a workspace) posts _FAILED with
# its error, reset() posts "reset". A peer that meets _FAILED in an op's exchange raises
# PeerFailed naming that error; in one of _GOES_ON it goes past it to the next number,
# where the failed rank's own call of it is; every rank then stands at the same number.
# reset() also realigns the numbers of every rank, whatever happened before (issue 41).
# A barrier made inside a call (ctx.building: a constructor's, a build's) is part of that
# call and never goes past: the peer's _FAILED is its failure of this very call.
# A rank that gives up on every call for now (an error escaped the function that
# trident.launch runs on it: it makes no exchange until its launcher resets it) posts
# _LEFT: a peer meets it in any exchange, _GOES_ON too, and raises PeerFailed at once.
_FAILED = "(failed)"
_LEFT = "(left)"
_GOES_ON = ("barrier", "close", "destroy_process_group")


def _digest(obj) -> int:
    return int.from_bytes(hashlib.blake2b(repr(obj).encode(), digest_size=8).digest(),
                          "little", signed=True)


def _name_words(name: str) -> list[int]:
    raw = name.encode()[:8 * _NAME_WORDS].ljust(8 * _NAME_WORDS, b"\0")
    return [int.from_bytes(raw[i:i + 8], "little", signed=True) for i in range(0, len(raw), 8)]


def _words_name(words) -> str:
    return b"".join(int(w).to_bytes(8, "little", signed=True) for w in words).rstrip(b"\0") \
        .decode(errors="replace")


class ExchangeMethods:
    """The host exchanges of trident.Context. They use the context's rank, world_size,
    group, host_timeout_s, _check_open(), _closed, _calling, _host_step and _op_phrase()
    (set by Context.__init__ and SyncMethods); `_init_exchanges` makes their own state."""

    def _init_exchanges(self) -> None:
        self._exchanges = 0          # host header exchanges made (the same on every rank)
        self._posted: list = []      # (exchange number, key) this rank set in the store
        self._resets = 0             # resets made (the same on every rank): their keys
        self._went_past = []         # peers' failed calls the last host call went past
        self._exchange_store = _exchange_store(self.group)
        self._peer_closed = False    # a peer was found closing: close() has no one to meet

    def host_exchange(self, what: str, payload=(), detail=None, check_step: bool = True):
        """One host-side collective: every rank sends a fixed-size header (the call's name
        `what`, its step number since init/reset, a digest of `detail`) and up to
        9 int64 payload words; returns (every rank's payload words, the ranks' `detail`s
        if they differ, else None).

        Raises, on every rank alike, CallMismatch naming each rank's call when the ranks
        are not in the same call; PeerFailed naming a peer's error when that peer's op
        raised before this exchange (its one-sided _FAILED header; a call of _GOES_ON made
        outside any op's call goes past it instead, to the peer's next exchange, and
        records it in `_went_past`) or gave up (its _LEFT header: `leave`);
        HostTimeout when a rank does not come within the context's timeout, after which
        every later one raises GroupUnusable at once."""
        self._check_open()
        self._check_group(what, detail)
        payload = [int(p) for p in payload]
        if len(payload) > _PAYLOAD_WORDS:
            raise AssertionError(f"host_exchange payload of {len(payload)} words")
        self._went_past = []
        while True:
            mine = self._header(what, detail, payload)
            table = self._all_gather_header(mine, lambda: self._describe_call(what, detail))
            if any(row[0] != _HEADER_MAGIC for row in table):
                bad = [r for r, row in enumerate(table) if row[0] != _HEADER_MAGIC]
                raise CallMismatch(what, self.rank, bad[0], message=(
                    f"{what}: rank {self.rank}'s host-side collective met another kind of "
                    f"collective on rank(s) {bad} (a torch.distributed call?); the ranks are "
                    f"out of step"))
            names = [_words_name(row[3:3 + _NAME_WORDS]) for row in table]
            failed = [r for r, name in enumerate(names) if name in (_FAILED, _LEFT)]
            rest = [r for r in range(self.world_size) if r not in failed]
            alike = (len({names[r] for r in rest}) == 1
                     and (not check_step or len({table[r][1] for r in rest}) == 1))
            if failed and alike and what in _GOES_ON and self._calling is None \
                    and all(names[r] == _FAILED for r in failed):
                causes = self._read_calls(failed)
                self._went_past += [(r, causes[i]) for i, r in enumerate(failed)]
                continue         # the failed ranks' own call of it is their next exchange
            break
        if failed or not alike:
            # a peer that closes is gone after this: close() then has no one to meet
            self._peer_closed = any(n in ("close", "destroy_process_group") for n in names)
            describe = self._describe_call(what, detail)
            calls = self._gather_objects("calls", describe, lambda: describe)
            if alike:
                raise PeerFailed(describe, self.rank, failed[0], calls[failed[0]])
            steps = [row[1] for row in table]
            lines = "; ".join(f"rank {r} called {c} (its host-side call #{steps[r]})"
                              for r, c in enumerate(calls))
            raise CallMismatch(what, self.rank, None, message=(
                f"ranks made different calls at the same point: {lines}. Every rank must "
                f"make the same trident calls in the same order (did a rank skip one?); "
                f"call ctx.reset() on every rank"))
        details = None
        if len({row[2] for row in table}) > 1:
            details = self._gather_objects("details", detail,
                                           lambda: self._describe_call(what, detail))
        return [row[3 + _NAME_WORDS:] for row in table], details

    def _check_group(self, what: str, detail) -> None:
        earlier = failed(self.group)     # a group that failed once stays unusable
        if earlier is not None:
            raise GroupUnusable(self._describe_call(what, detail), self.rank, earlier)

    def _header(self, what: str, detail, payload=()) -> torch.Tensor:
        """The next host exchange's header (its step number taken)."""
        step = self._host_step
        self._host_step += 1
        return torch.tensor([_HEADER_MAGIC, step, _digest(detail), *_name_words(what),
                             *payload, *[0] * (_PAYLOAD_WORDS - len(payload))],
                            dtype=torch.int64)

    def _post_alone(self, what: str, describe) -> None:
        """Take the next exchange's number without waiting for the peers: post header
        `what` and the call's description `describe` (what a peer's error quotes: a
        Failure, or text), for a peer that waits in that exchange (see _FAILED)."""
        n = self._exchanges
        self._exchanges += 1
        mine = self._header(what, None)
        self._set(n, f"{n}/calls/{self.rank}", pickle.dumps(describe))   # before the header
        self._set(n, f"{n}/{self.rank}", mine.numpy().tobytes())

    def post_failure(self, op: str, exc: BaseException) -> None:
        """This rank's call of `op` raised `exc` before its first host exchange (a build's
        input check, trident/api/context_ops.py): peers that wait in that exchange raise
        PeerFailed naming it, at once (a one-sided _FAILED header). A courtesy: never
        raises, nothing on a group that failed."""
        if self._closed or failed(self.group) is not None:
            return
        try:
            self._post_alone(_FAILED, Failure.of(exc, self.rank, op))
        except Exception:        # noqa: BLE001 -- the error itself is what the caller raises
            pass

    def leave(self, what: str, exc: BaseException) -> None:
        """An error `exc` escaped `what` (the function trident.launch runs on this rank),
        which may have left peers waiting for this rank in a call it will not make: their
        kernels' waits (the error published) and their host exchange at this rank's next
        number (a one-sided _LEFT header, which no call goes past) stop at once with
        PeerFailed naming it. The launcher's reset() realigns the ranks after. A courtesy
        like post_failure: never raises, nothing on a closed context or a failed group."""
        if self._closed or failed(self.group) is not None:
            return
        try:
            if not self.handed_over(exc):
                self._publish(exc)
            # the mark holds this context, which does not pickle: exc goes to the launcher
            getattr(exc, "__dict__", {}).pop("_trident_handed_over", None)
            self._post_alone(_LEFT, Failure.of(exc, self.rank, what))
        except Exception:        # noqa: BLE001 -- the error itself is what the caller raises
            pass

    def fail_call(self, op: str, exc: BaseException) -> BaseException:
        """This rank will not make call `op`, which raised `exc` before any host exchange
        (an input check outside a plan's build: the torch backend's): its peers' waits for
        it, in the call's kernels or host exchanges, stop at once naming it. Returns exc.
        An error already handed over (`handed_over`: a layer below did) is not again."""
        if not self.handed_over(exc):
            self._publish(exc)
            self.post_failure(op, exc)
        return exc

    def handed_over(self, exc: BaseException) -> bool:
        """Whether `exc` was handed to the peers already (fail_call, or a plan's build:
        trident/api/context_ops.py); marks it handed over from now on. Each error counts
        once in what the peers compare (context_sync.py `_publish`), whatever layers of
        checks it passes through."""
        if getattr(exc, "_trident_handed_over", None) is self:
            return True
        try:
            exc._trident_handed_over = self
        except AttributeError:          # an exception type without a __dict__
            pass
        return False

    def _read_calls(self, ranks) -> list:
        """The descriptions that `ranks` posted with their headers of the last exchange."""
        n = self._exchanges - 1
        return [pickle.loads(b) for b in self._exchange_store.multi_get(
            [f"{n}/calls/{r}" for r in ranks])]

    def _set(self, n: int, key: str, data: bytes) -> None:
        """Set `key` (of exchange number `n`) in this context's store keys; deleted once
        every peer has read it (_forget_before)."""
        self._exchange_store.set(key, data)
        self._posted.append((n, key))

    def _forget_before(self, n) -> None:
        """Delete this rank's keys of exchanges before number `n`: every peer has posted a
        key of `n` (or is in reset), so it is done reading them."""
        keep = []
        for m, key in self._posted:
            if m < n:
                try:
                    self._exchange_store.delete_key(key)
                except Exception:      # noqa: BLE001 -- housekeeping only
                    pass
            else:
                keep.append((m, key))
        self._posted = keep

    def _describe_call(self, what: str, detail) -> str:
        if what == "workspace":
            return f"{self._op_phrase()} (a call that creates the workspace {detail!r})"
        if what == "barrier" and self._calling is not None:
            return f"{self._calling} (its host barrier)"
        if what in ("barrier", "reset", "close"):
            return f"ctx.{what}()"
        if what == "destroy_process_group":
            return "dist.destroy_process_group() (which closes the group's trident context)"
        if isinstance(detail, _Joined):
            return (f"{what} (a collective whose kernel found rank(s) {list(detail.peers)} "
                    f"waiting in a host-side call instead)")
        return what if detail is None else f"{what} with {detail}"

    def _all_gather_header(self, mine: torch.Tensor, describe) -> list[list[int]]:
        """all_gather of the header through the store, bounded by the host timeout;
        describe() names the call in the error."""
        n = self._exchanges
        self._exchanges += 1        # every rank counts alike (a failed one: the group is gone)
        rows = self._store_gather(str(n), mine.numpy().tobytes(), describe, n)
        self._forget_before(n)      # every peer has set key n, so it has read all before
        return [torch.frombuffer(bytearray(row), dtype=torch.int64).tolist() for row in rows]

    def _store_gather(self, tag: str, data: bytes, describe, n) -> list[bytes]:
        """Every rank's `data` under key `tag` of this context's store keys, in rank order
        (`n`: the exchange number the key belongs to, for _forget_before)."""
        store = self._exchange_store
        keys = [f"{tag}/{r}" for r in range(self.world_size)]
        try:
            self._set(n, keys[self.rank], data)
            store.wait(keys, datetime.timedelta(seconds=self.host_timeout_s))
            return store.multi_get(keys)
        except RuntimeError as e:
            mark_failed(self.group, describe())
            raise HostTimeout(describe(), self.rank, self.host_timeout_s,
                              str(e).strip()[:200], _missing(store, keys)) from None

    def _gather_objects(self, tag: str, obj, describe) -> list:
        """Every rank's `obj` (pickled) through the store: the calls and details of a
        header exchange that found a difference."""
        n = self._exchanges - 1
        return [pickle.loads(b) for b in self._store_gather(
            f"{n}/{tag}", pickle.dumps(obj), describe, n)]

    def _realign(self, payload) -> list[list[int]]:
        """reset()'s meeting, whatever exchange number each rank stands at (ranks that
        failed apart may stand one or more apart): post "reset" at this rank's number (a
        peer waiting there in another call raises CallMismatch naming it, and comes to its
        own reset), meet every rank's reset under keys of their own, then continue every
        rank from the highest number. Returns every rank's `payload` (int64 words)."""
        self._check_open()
        self._check_group("reset", None)
        self._post_alone("reset", "ctx.reset()")
        gen = self._resets
        self._resets += 1
        rows = self._store_gather(f"reset{gen}", torch.tensor(
            [self._exchanges, *payload], dtype=torch.int64).numpy().tobytes(),
            lambda: "ctx.reset()", -1)
        rows = [torch.frombuffer(bytearray(row), dtype=torch.int64).tolist() for row in rows]
        start = max(row[0] for row in rows)
        mine = self._posted.pop()            # this reset's key: read by peers still
        self._forget_before(float("inf"))    # every peer is in reset: past all the rest
        self._posted.append((start - 1, mine[1]))   # gone after the next exchange
        self._exchanges, self._host_step = start, 0
        return [row[1:] for row in rows]


def _missing(store, keys) -> tuple:
    """The ranks whose key of `keys` (one per rank, in rank order) is not in `store`: those
    that did not come to an exchange (an error path; () where the store cannot say)."""
    try:
        return tuple(r for r, key in enumerate(keys) if not store.check([key]))
    except Exception:        # noqa: BLE001 -- naming them is a courtesy
        return ()


def _exchange_store(group):
    """A store of this context's own for host exchanges: the group's store under a prefix
    that rank 0 draws and the others receive (one collective, at init)."""
    box = [uuid.uuid4().hex]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    from torch.distributed import distributed_c10d as c10d
    return dist.PrefixStore(f"trident-host/{box[0]}/", c10d._get_process_group_store(group))


class _Joined:
    """host_exchange's detail for a collective that joins a peer's host call (the peers
    found waiting there), so that the error names it."""
    __slots__ = ("peers",)

    def __init__(self, peers: tuple):
        self.peers = peers

    def __repr__(self) -> str:
        return f"_Joined({self.peers})"
