"""Context's host-side collectives and error checks: timeouts, sync (a rank's device
errors), the host barrier (every rank's errors and heap allocations), the debug-mode
agreement check and reset, all made of the header exchange (context_exchange.py).

Part of the runtime's Context (context.py), which inherits SyncMethods; this module does not
import context.py."""
from __future__ import annotations

import time
import weakref

import torch
import torch.distributed as dist

from .context_exchange import _Joined, _digest
from .errors import (ERROR_MARK, ERROR_PUBLISHED, HOST_CALL_CODES, KIND_HOST_CALL, KIND_PEER_FAILED,
                     CallMismatch, Failure, HeapMismatchError, HostTimeout, PeerFailed,
                     decode_timeout, device_error, value_error_message)
from .control import (CTRL_BASES, CTRL_ERROR, CTRL_FAILED, CTRL_HOST_CALL, CTRL_HOST_DONE,
                      CTRL_HOST_WORD, CTRL_TEXT, CTRL_TEXT_WORDS, CTRL_TIMEOUT, CTRL_VALUE_ERROR,
                      CTRL_WORDS, MAX_RANKS)


def check_timeout(seconds, name: str = "timeout") -> None:
    """A timeout (td.init's, set_timeout's): a positive, finite number of seconds."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        raise TypeError(f"{name} must be a number of seconds, got {type(seconds).__name__} "
                        f"{seconds!r}")
    if not 0 < seconds < float("inf"):            # also NaN
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {seconds!r}")


class SyncMethods:
    """The synchronisation methods of trident.Context. They use the context's rank,
    world_size, group, backend, device, debug, ctrl, allocator, plans, capturing,
    _check_open(), _workspaces, _resettable, _host_step, _error_view and _failure (set by
    Context.__init__).

    Errors and the state they leave (README, Concepts, "Errors"):
    - a device wait that gave up (timeout, a peer that failed, a call that differs)
      records a code in the rank's error word; the host reads it without a device sync
      (`_error_view`: the word's host mirror, written by the wait that records the first
      error: pinned memory on GPUs, plain memory on the CPU emulation), so the next call
      on the rank raises it at once (PlanCache.get), as do sync() and barrier(). That
      failure is sticky (`_failure`) until reset(): the rank's device state (epochs,
      flags) is out of step with its peers';
    - an error that leaves this rank out of step with its peers -- a plan build that
      raised (the rank skips the launch its peers make), a failed wait -- is published
      (`_publish`): a count of errors and the message in the rank's control block (bad
      values a kernel dropped are not: that rank went on in step), so that a peer whose
      kernel waits for this rank stops at once with PeerFailed naming the cause, instead
      of timing out. Ranks that fail alike keep equal counts and do not stop each other.
      The rank that published meets its peers before its next launch (`_meet_peers`), so
      that its next call never pairs with the call it skipped on theirs.
    """

    def _init_errors(self) -> None:
        """The control block's error plumbing (called by Context.__init__ once `ctrl`
        exists): every rank's heap base (so a wait can read its peer's error words), the
        word the host reads without a sync, and the hot path's check of it."""
        # pinned host memory is mapped into the device's address space (UVA): waits
        # store their error code there too, and the host reads it with no sync. The CPU
        # emulation keeps the same separate word (plain memory: the interpreter's kernels
        # run in this process), so that it reads errors the way GPUs do (it read the
        # control block itself, which hid a mirror that named the wrong error: issue 29)
        self._host_error = torch.zeros(1, dtype=torch.int64,
                                       pin_memory=self.backend == "cuda")
        words = self._host_error.numpy()
        # a memoryview of int64: an element read costs ~50 ns (a numpy element ~300)
        self._error_view = memoryview(words).cast("B").cast("q")
        self._failure = None
        self._published = 0          # errors this rank published since reset (CTRL_FAILED)
        self._barrier_met = False    # the last _barrier's exchange met every rank
        self._init_exchanges()
        self._link_ctrl()
        self.plans.watch(self._error_view, self._on_error)

    def _link_ctrl(self) -> None:
        """Write what waits read besides the error words into the control block (at init
        and after reset zeroes it): every rank's heap base and the host mirror's address."""
        self.ctrl[CTRL_TIMEOUT] = int(self.timeout_s * 1e9)
        self.ctrl[CTRL_BASES:CTRL_BASES + self.world_size] = self.heap_bases
        self.ctrl[CTRL_HOST_WORD] = self._host_error.data_ptr()
        self.ctrl[CTRL_HOST_DONE] = self._exchanges

    def _on_error(self, key=("the call",)) -> None:
        """What a call does when the host mirror of the error word is set (PlanCache.get,
        before every lookup of `key`): raise this rank's failure, unless the word only says
        that this rank published an error of its own (ERROR_PUBLISHED): then it meets its
        peers first (`_meet_peers`) and, where they are in step, the call goes on."""
        if self._failure is None and self._error_view[CTRL_ERROR] == ERROR_PUBLISHED:
            self._meet_peers(key[0] if key and isinstance(key[0], str) else "the call")
            return
        self._raise_failure()

    def raise_if_failed(self, op: str = "the call") -> None:
        """What every call does first, for host code that reads a call's results itself:
        raise this rank's device failure (`_on_error`) if the host mirror of the error word
        is set. No synchronisation: call it once the work is known done (e.g. after a
        .tolist() of its output on the stream), where a failed wait left the output
        poisoned."""
        if self._error_view[CTRL_ERROR]:
            self._on_error((op,))

    def _meet_peers(self, op: str) -> None:
        """The first call `op` after this rank published an error (`_publish`) that its peers
        may not share: a build that raised on this rank only, which never launched the call
        its peers did. Their kernels of that call wait for this rank, and this call's
        signals would satisfy them: both calls would then end with the other's data, and no
        error on either rank. So, before anything is launched, wait (within the context's
        timeout) until every peer has published as many errors (it made the same mistake:
        the ranks are in step and the call goes on) or has stopped (its error word is set:
        raise PeerFailed naming it, here and at every call until ctx.reset()). A peer that
        does neither within the timeout does not wait for this rank (its own wait would
        have ended by then): the call goes on."""
        deadline = time.monotonic() + self.timeout_s
        peers = [p for p in range(self.world_size) if p != self.rank]
        while peers:
            behind = []
            for peer in peers:
                if int(self._heap.peer_view(peer, self.ctrl, CTRL_ERROR, 1).item()):
                    self._fail_sticky(PeerFailed(
                        f"{op} (the call after the error this rank raised)", self.rank, peer,
                        self._peer_message(peer)))
                    if not self.handed_over(self._failure):     # raised again, it counts once
                        self._publish(self._failure)
                    raise self._failure
                if int(self._heap.peer_view(peer, self.ctrl, CTRL_FAILED, 1).item()) \
                        < self._published:
                    behind.append(peer)
            if not behind or time.monotonic() > deadline:
                break
            peers = behind
            time.sleep(0.0005)
        if self._error_view[CTRL_ERROR] == ERROR_PUBLISHED:
            self._error_view[CTRL_ERROR] = 0

    def _raise_failure(self, word: int | None = None):
        """Raise this rank's device failure: the first one (sticky until reset) or the one
        the error word records now (`word`, else the host-visible word)."""
        if self._failure is None:
            word = int(self._error_view[CTRL_ERROR]) if word is None else word
            self._failure = (self._join_host_call(word)
                             or device_error(word, self.timeout_s, self._peer_message))
            if not self.handed_over(self._failure):     # raised again, it counts once
                self._publish(self._failure)
        raise self._failure

    # ------------------------------------------------------------ a peer in a host call
    def _enter_host_call(self, what: str) -> None:
        """Publish that this rank, its device work finished, waits in host call `what` (a
        barrier, close, reset, workspace creation): a peer kernel that waits for this rank
        meanwhile made another call, and stops with a CallMismatch (language/sync.py, "A
        peer in a host-side call")."""
        if not self.capturing():
            self.ctrl[CTRL_HOST_CALL] = ((self._exchanges + 1) << 8) | HOST_CALL_CODES.get(what, 0)

    def _leave_host_call(self) -> None:
        """The host call is over: clear the word, and record the exchanges done (a peer's
        word of a call this rank made too is stale, not a mismatch). Stream-ordered before
        this rank's next kernels."""
        if not self.capturing():
            self.ctrl[CTRL_HOST_CALL] = 0
            self.ctrl[CTRL_HOST_DONE] = self._exchanges

    def _join_host_call(self, word: int):
        """When this rank's kernel stopped because a peer waited in a host-side call
        (KIND_HOST_CALL, here or behind a chain of PeerFailed), join that peer's host
        exchange under this rank's call, so that every rank raises CallMismatch naming
        each rank's call; returns that error (None where there is nothing to join)."""
        if self._closed or self.capturing() or not self._caused_by_host_call(word):
            return None
        waiting = []
        for peer in range(self.world_size):
            if peer != self.rank:
                call = int(self._heap.peer_view(peer, self.ctrl, CTRL_HOST_CALL, 1).item())
                if (call >> 8) > self._exchanges:     # a call this rank has not made
                    waiting.append((peer, call & 0xFF))
        if not waiting:
            return None
        op = decode_timeout(word)[0]
        try:
            self.host_exchange(op, detail=_Joined(tuple(p for p, _ in waiting)))
        except (CallMismatch, HostTimeout, PeerFailed) as exc:
            return exc
        return None

    def _caused_by_host_call(self, word: int) -> bool:
        """Whether the error `word` is KIND_HOST_CALL, directly or through PeerFailed on a
        peer whose own error word is (followed up to world_size ranks)."""
        for _ in range(self.world_size):
            kind = (word >> 48) & 0xFF
            if kind == KIND_HOST_CALL:
                return True
            if kind != KIND_PEER_FAILED or word == ERROR_MARK:
                return False
            try:
                word = int(self._heap.peer_view(word & 0xFFFF, self.ctrl, CTRL_ERROR, 1).item())
            except Exception:        # noqa: BLE001 -- a courtesy: never hide the failure
                return False
        return False

    def _publish(self, exc: BaseException) -> None:
        """Tell the peers that this rank raised `exc`: its message, then one more error in
        the count their waits compare with their own (language/sync.py). Not while a CUDA
        graph is captured (the writes would become part of the graph)."""
        if self._closed or self.capturing():
            return
        # its type name, a NUL, its message: what _peer_message reads back as a Failure
        text = f"{type(exc).__name__}\0{exc}".encode()[:8 * CTRL_TEXT_WORDS - 1]
        words = torch.frombuffer(bytearray(text.ljust(8 * CTRL_TEXT_WORDS, b"\0")),
                                 dtype=torch.int64)
        self.ctrl[CTRL_TEXT:CTRL_TEXT + CTRL_TEXT_WORDS].copy_(words)
        self.ctrl[CTRL_FAILED:CTRL_FAILED + 1].add_(1)     # after the text, in stream order
        self._published += 1
        if not self._error_view[CTRL_ERROR]:      # the next call meets the peers first
            self._error_view[CTRL_ERROR] = ERROR_PUBLISHED

    def _peer_message(self, peer: int, depth: int = 0) -> "Failure | str":
        """Why rank `peer` failed, as a Failure ("" where unknown): the last error it
        published (read from its control block; a copy over the link on GPUs: an error
        path only), else what its error word records. A wait stops on a peer whose error
        word is set as soon as it sees it, but the peer publishes its message only when
        its host raises (its next call, sync or barrier), which may come after this
        rank's: the word names the cause meanwhile (a CallMismatch the peer found, quoted
        by this PeerFailed), and a word that is itself PeerFailed is followed to the rank
        it names (at most world_size ranks deep), so the root cause is quoted."""
        try:
            words = self._heap.peer_view(peer, self.ctrl, CTRL_TEXT, CTRL_TEXT_WORDS).cpu()
            text = bytes(words.numpy().tobytes()).rstrip(b"\0").decode(errors="replace")
            if text:
                kind, _, message = text.partition("\0")
                return Failure(kind, peer, message)
            word = int(self._heap.peer_view(peer, self.ctrl, CTRL_ERROR, 1).item())
            if not word or word == ERROR_MARK:
                return ""
            deeper = depth + 1 < self.world_size
            exc = device_error(word, self.timeout_s,
                               (lambda p: self._peer_message(p, depth + 1)) if deeper else None)
            return Failure.of(exc, peer)
        except Exception:         # the message is a courtesy: never hide the failure
            return ""

    @property
    def host_timeout_s(self) -> float:
        """Limit of a host-side collective: the device timeout plus 5 s, since a peer may
        reach it only after one of its device waits has timed out."""
        return self.timeout_s + 5.0

    def set_timeout(self, seconds: float) -> None:
        """Limit of every device-side wait. Past it, the wait gives up and CommTimeout follows."""
        check_timeout(seconds)
        self.timeout_s = float(seconds)
        self.ctrl[CTRL_TIMEOUT] = int(seconds * 1e9)

    def sync(self) -> None:
        """Wait for this rank's queued device work; raise CommTimeout if a wait timed out,
        else ValueError if a kernel recorded a bad input value (e.g. an MoE expert id)."""
        self._check_open()
        if self.backend == "cuda":
            torch.cuda.synchronize(self.device)
        timeout, value = self._error_words()
        self._raise_if_timed_out(timeout)
        self._raise_value_error(value)

    def _raise_if_timed_out(self, word: int) -> None:
        if word or self._failure is not None:
            self._raise_failure(word)

    def _error_words(self) -> tuple[int, list[int]]:
        """This rank's timeout word and bad-value record (kind, 4 words; see
        language/sync.py), read in one device->host copy after the device work is done."""
        first = int(CTRL_VALUE_ERROR)
        words = self.ctrl[:first + 5].tolist()
        return words[CTRL_ERROR], words[first:]

    def _raise_value_error(self, record: list[int], rank: int | None = None) -> None:
        """Raise a bad value that a kernel recorded (and dropped) as ValueError: this rank's
        own record (cleared first), or rank `rank`'s as the barrier saw it."""
        if record[0]:
            if rank is None:
                first = int(CTRL_VALUE_ERROR)
                self.ctrl[first:first + 5] = 0
            # not published to the peers (_publish): the kernel dropped the bad values and
            # went on, so this rank is in step with them; barrier() raises it everywhere
            raise ValueError(value_error_message(record[0], record[1:],
                                                 self.rank if rank is None else rank))

    def after_op(self) -> None:
        """Called by every op after its launch: in debug mode, synchronise and check every
        rank's errors, so that all ranks raise at this call (not while a CUDA graph is
        captured: a sync there invalidates the capture)."""
        if self.debug and not self.capturing():
            self._barrier("debug check")

    def barrier(self) -> None:
        """Host barrier: finishes device work, checks every rank's error words (timeouts
        raise CommTimeout, bad input values that kernels recorded raise ValueError, on every
        rank) and that all ranks made the same heap allocations, then synchronises the ranks.
        A rank that made another host-side call meanwhile (an op's first call, a debug
        check) makes every rank raise CallMismatch; one that never comes, HostTimeout
        after the context's timeout."""
        self._barrier("barrier")

    def _barrier(self, what: str, detail=None, failed: int = 0):
        """The barrier's checks under the header `what`; returns every rank's `failed`
        word and, when the ranks' `detail`s differ, the list of them (else None). When a
        rank failed or the details differ, it returns before checking the heap and the
        error words (the caller undoes its step on every rank first)."""
        self._check_open()
        if self.backend == "cuda":
            torch.cuda.synchronize(self.device)
        timeout, value = self._error_words()
        self._enter_host_call(what)
        self._barrier_met = False
        try:
            table, details = self.host_exchange(
                what, [self.allocator.digest(), timeout, *value, failed], detail=detail)
            self._barrier_met = True     # every rank is in this call (close() reads it)
        except HostTimeout:
            self._raise_if_timed_out(timeout)    # a wait of this rank's that timed out says more
            raise
        finally:
            self._leave_host_call()
        failed = [row[7] for row in table]
        if details is not None or any(failed):
            return failed, details               # the caller rolls back on every rank
        digests = [row[0] for row in table]
        errors = [row[1] for row in table]
        values = [row[2:7] for row in table]
        if len(set(digests)) > 1:
            self._raise_heap_mismatch(digests)
        self.allocator.log.clear()
        if errors[self.rank]:
            self._raise_if_timed_out(errors[self.rank])
        for word in errors:
            if word:
                raise device_error(word, self.timeout_s, self._peer_message)
        # a bad input value on any rank: every rank raises (its own record first), so
        # that callers that go on to collective work (frees) stay in step
        self._raise_value_error(value)
        for rank, record in enumerate(values):
            self._raise_value_error(record, rank)
        if self._went_past:         # a peer failed a call that this rank made
            peer, cause = self._went_past[0]
            raise PeerFailed(self._describe_call(what, detail), self.rank, peer, cause)
        if self._error_view[CTRL_ERROR] == ERROR_PUBLISHED:
            self._error_view[CTRL_ERROR] = 0      # every rank is here, none failed: in step
        return failed, details

    def host_call(self, what: str, detail=None):
        """A host exchange `what` that this rank makes where its peers may be in device
        work of a call it does not make (the torch backend's fallback to its inner group:
        trident/torch/backend/fallback.py): published as a host call while it waits, as
        a barrier is, so that a peer kernel that waits for this rank stops at once and
        its host joins this exchange (every rank then raises CallMismatch naming each
        rank's call). Returns the ranks' `detail`s where they differ, else None."""
        self._enter_host_call(what)
        try:
            return self.host_exchange(what, detail=detail)[1]
        finally:
            self._leave_host_call()

    def agree(self, op: str, *signature) -> None:
        """Debug mode's check before an op: raise ValueError if the ranks called `op` with
        different sizes (`signature`: what must be equal everywhere), CallMismatch
        (naming each rank's call) if a rank is in another call. One fixed-size host
        exchange, which a peer's barrier or other check cannot be confused with."""
        _, everyone = self.host_exchange(op, detail=signature)
        for rank, theirs in enumerate(everyone or ()):
            if theirs != signature:
                raise ValueError(f"{op}: rank {self.rank} called with {signature} but rank "
                                 f"{rank} with {theirs}; every rank must pass the same sizes")

    def agree_once(self, op: str, *signature) -> None:
        """`agree`, the first time this rank builds a call `op` with `signature` that hands
        its tensors to torch.distributed (the "nccl" algorithm, the "plain" schedule):
        NCCL waits without bound for bytes that a peer with other sizes never sends, and
        gloo aborts the process. Ranks whose new call differs then raise ValueError on
        every rank, before either reaches torch.distributed. A call agreed before costs
        nothing (a set lookup at its build). Not covered: a rank whose call was agreed
        before while a peer's is new; the peer's exchange times out (HostTimeout), this
        rank is inside torch.distributed by then (debug mode checks every call)."""
        key, agreed = (op, *signature), vars(self).setdefault("_agreed_calls", set())
        if key not in agreed:
            self.agree(op, *signature)
            agreed.add(key)

    def _raise_heap_mismatch(self, digests: list[int]) -> None:
        logs = [None] * self.world_size
        dist.all_gather_object(logs, list(self.allocator.log), group=self.group)
        ref = 0
        other = next(r for r in range(self.world_size) if digests[r] != digests[ref])
        a, b = logs[ref], logs[other]
        i = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
        req_a = a[i] if i < len(a) else "(nothing)"
        req_b = b[i] if i < len(b) else "(nothing)"
        raise HeapMismatchError(
            f"symmetric heap allocations differ between rank {ref} and rank {other}: request "
            f"#{i} since the last barrier was '{req_a}' on rank {ref} but '{req_b}' on rank "
            f"{other}. Every rank must allocate and free the same sizes in the same order.")

    def register_reset(self, obj) -> None:
        """Have ctx.reset() also call obj.reset() (kept as a weak reference): for objects
        with device epochs and flags that are not workspaces, e.g. ExpertParallel."""
        self._resettable.append(weakref.ref(obj))

    def reset(self) -> None:
        """Collective: after a failure, bring error words, epochs and flags back to zero on
        every rank so that the context can be used again: the next correct call is right.

        The heap itself cannot be repaired: if the ranks' live heap blocks differ (a rank
        allocated a size the others did not), reset raises HeapMismatchError naming the
        first difference, and every call raises it again until the ranks free what differs
        and call reset() once more."""
        if self.backend == "cuda":
            torch.cuda.synchronize(self.device)
        blocks = sorted((o, self.allocator.length(o)) for o in self.allocator.live_offsets())
        # not published as a host call (_enter_host_call): ranks come to reset at different
        # times after a failure, and a peer still waiting for this rank has failed already
        table = self._realign([_digest(blocks)])
        if len({row[0] for row in table}) > 1:
            everyone = [None] * self.world_size
            dist.all_gather_object(everyone, blocks, group=self.group)
            self._fail_sticky(_heap_difference(everyone))
            raise self._failure
        self.plans.clear()
        self.ctrl.zero_()
        self._error_view[CTRL_ERROR] = 0        # the host's mirror of the error word
        self._failure = None
        self._published = 0
        self._link_ctrl()
        self.allocator.restart_log()      # the heaps agree: compare from here on
        for ws in list(self._workspaces.values()) + [r() for r in self._resettable]:
            if ws is not None and hasattr(ws, "reset"):
                ws.reset()
        if self.backend == "cuda":
            torch.cuda.synchronize(self.device)
        self.host_exchange("reset", check_step=False)
        self._host_step = 0

    def _fail_sticky(self, exc: BaseException) -> None:
        """Make every later call on this rank raise `exc` at once, until a reset works."""
        self._failure = exc
        if not self._error_view[CTRL_ERROR]:
            self._error_view[CTRL_ERROR] = ERROR_MARK


def _heap_difference(everyone: list) -> HeapMismatchError:
    """The first difference between the ranks' live heap blocks ((offset, bytes) lists)."""
    ref = everyone[0]
    for rank, blocks in enumerate(everyone[1:], 1):
        if blocks != ref:
            mine, theirs = set(ref) - set(blocks), set(blocks) - set(ref)
            first = min(mine | theirs)
            where = ("rank 0" if first in mine else f"rank {rank}")
            return HeapMismatchError(
                f"reset: the ranks' symmetric heaps differ: {where} holds a block of "
                f"{first[1]} bytes at offset {first[0]} that "
                f"{'rank ' + str(rank) if first in mine else 'rank 0'} does not. A heap that "
                f"differs cannot be repaired: free the tensors that were allocated with "
                f"different sizes (ctx.free on every rank), then call ctx.reset() again")
    return HeapMismatchError("reset: the ranks' symmetric heaps differ")
