"""Finding races in the logs (see trident/sanitize/__init__.py, "Checking"): every pair of
accesses logged in the generation, any ranks', at least one a plain access and one a
write, that no clock orders, described by heap owner, offset, kernel and program."""
from __future__ import annotations

import numpy as np

from .log import _ACCESSES, _COORD, _LAUNCHES, _RELEASES, _SEGMENTS, ATOMIC, MAX_PROGRAMS, WRITE

SEED_ENV = "TRIDENT_SANITIZE_SEED"


class RaceError(RuntimeError):
    """Two accesses to the same heap bytes, at least one a write, from different ranks or
    programs, that nothing orders (found by the sanitizer, TRIDENT_SANITIZE=1)."""


class Checking:
    """Sanitizer's checks (a base class of trident.sanitize.sanitizer.Sanitizer, whose
    banks, generation, marks and reported pairs they read)."""

    def _name(self, r: int, launch: int) -> str:
        bank = self._bank(r)
        if bank is None or not 0 <= launch < _LAUNCHES:
            return "?"
        return bytes(bank.names[launch]).rstrip(b"\0").decode(errors="replace") or "?"

    def _full_logs(self) -> list[int]:
        return [r for r in range(self.world) if (b := self._bank(r)) is not None and b.hdr[5]]

    def _raise_if_full(self) -> None:
        full = self._full_logs()
        if full:
            raise RuntimeError(
                f"trident sanitizer: the log of rank(s) {full} is full for this generation "
                f"(more than {_ACCESSES} accesses, {_SEGMENTS} clock snapshots, {_RELEASES} "
                f"releases or {_LAUNCHES} launches between two host barriers); call "
                f"ctx.barrier() more often while sanitizing")

    def check(self) -> tuple[list[tuple[int, int, int, int]], list[str]]:
        """Races among the accesses logged so far in the current generation, whichever ranks
        made them, that were not reported before: (an id per racing pair: (rank, row in its
        log) of both accesses; a description of the first few). Every rank that checks the
        same logs finds the same races, so that every rank can raise the same error."""
        self._raise_if_full()
        parts, counts = [], []
        for r in range(self.world):
            bank = self._bank(r)
            n = 0 if bank is None else int(bank.hdr[1])
            counts.append(n)
            if n:
                e = np.empty((n, 11), dtype=np.int64)
                e[:, :8] = bank.acc[:n]
                e[:, 8] = r
                e[:, 10] = np.arange(n)                         # row in its rank's log
                e[:, 9] = np.arange(n) >= self.marks[r]          # new since the last check
                parts.append(e)
        self.marks = counts
        if not parts:
            return [], []
        E = np.concatenate(parts)
        if not E[:, 9].any():
            return [], []
        X = E[(E[:, 3] & ATOMIC) == 0]                  # plain accesses
        Y = E
        if not len(X):
            return [], []
        order = np.argsort(Y[:, 5], kind="stable")
        Y = Y[order]
        ys = Y[:, 5]
        maxlen = int((Y[:, 6] - Y[:, 5]).max())
        hi = np.searchsorted(ys, X[:, 6], side="left")
        lo = np.searchsorted(ys, X[:, 5] - maxlen, side="right")
        cnt = np.maximum(hi - lo, 0)
        pairs, found = [], []
        step = max(1, len(X) * 2_000_000 // max(1, int(cnt.sum())))
        for c0 in range(0, len(X), step):
            c = cnt[c0:c0 + step]
            xi = np.repeat(np.arange(c0, c0 + len(c)), c)
            if not len(xi):
                continue
            first = np.repeat(np.cumsum(c) - c, c)
            yj = np.repeat(lo[c0:c0 + step], c) + (np.arange(len(xi)) - first)
            x, y = X[xi], Y[yj]
            keep = ((y[:, 6] > x[:, 5]) & ((x[:, 3] | y[:, 3]) & WRITE != 0)
                    & ((x[:, 9] | y[:, 9]) != 0)
                    & (x[:, 0] != y[:, 0]))           # one program is ordered with itself
            # a pair of two plain accesses shows up twice: keep one
            both_plain = (y[:, 3] & ATOMIC) == 0
            keep &= ~both_plain | (x[:, 8] * _ACCESSES + x[:, 10] < y[:, 8] * _ACCESSES + y[:, 10])
            # two writes of the same bytes to the same range: either order leaves the same
            same = ((x[:, 3] & y[:, 3] & WRITE) != 0) & (x[:, 7] != 0) & (x[:, 7] == y[:, 7]) \
                & (x[:, 5] == y[:, 5]) & (x[:, 6] == y[:, 6])
            keep &= ~same
            x, y = x[keep], y[keep]
            if not len(x):
                continue
            vy = self._clock_of(y, x[:, 0])     # y's clock for x's thread
            vx = self._clock_of(x, y[:, 0])
            race = (x[:, 1] > vy) & (y[:, 1] > vx)
            if race.any():
                race[race] = ~self._rewritten(x[race], y[race], E)
            for a, b in zip(x[race], y[race]):
                pair = tuple(sorted([(int(a[8]), int(a[10])), (int(b[8]), int(b[10]))]))
                pair = pair[0] + pair[1]
                if pair not in self.reported:
                    pairs.append(pair)
                    if len(found) < 4:
                        found.append(self._describe(a, b))
        return pairs, found

    def _rewritten(self, x, y, E):
        """For racing (read, write) pairs: True where the reader is ordered after another
        write of the same bytes to the same range (e.g. publish_offset, where every program
        stores the same word: the read sees those bytes whichever write it meets)."""
        out = np.zeros(len(x), dtype=bool)
        writes = E[((E[:, 3] & (WRITE | ATOMIC)) == WRITE) & (E[:, 7] != 0)]
        if not len(writes):
            return out
        for i in range(len(x)):
            rd, wr = (x[i], y[i]) if not x[i, 3] & WRITE else (y[i], x[i])
            if rd[3] & WRITE or wr[7] == 0:
                continue
            z = writes[(writes[:, 7] == wr[7]) & (writes[:, 5] == wr[5]) & (writes[:, 6] == wr[6])
                       & (writes[:, 0] != wr[0])]
            if len(z):
                ordered = z[:, 1] <= self._clock_of(np.repeat(rd[None], len(z), 0), z[:, 0])
                out[i] = bool(ordered.any())
        return out

    def _clock_of(self, rows, tids):
        """Component `tids` of the clock snapshot each row was made under."""
        out = np.zeros(len(rows), dtype=np.int64)
        for r in range(self.world):
            sel = rows[:, 8] == r
            if sel.any():
                bank = self._bank(r)
                out[sel] = bank.segs[rows[sel, 2], tids[sel]]
        return out

    def _describe(self, a, b) -> str:
        start, end = int(max(a[5], b[5])), int(min(a[6], b[6]))
        owner, lo, hi = start >> _COORD, start & ((1 << _COORD) - 1), end & ((1 << _COORD) - 1)

        def who(e):
            kind = ("atomic " if e[3] & ATOMIC else "") + ("write" if e[3] & WRITE else "read")
            r, pid = int(e[8]), int(e[0]) % MAX_PROGRAMS
            return (f"{kind} by rank {r} program {pid} in kernel {self._name(r, int(e[4]))} "
                    f"(launch #{int(e[4])} on rank {r} since the last host barrier)")
        return (f"heap of rank {owner}, offset {lo}..{hi} ({hi - lo} bytes): {who(a)} / {who(b)}")

    def raise_if(self, pairs: list, found: list[str], where: str) -> None:
        """Raise RaceError for racing `pairs` (described by `found`), if any."""
        if not pairs:
            return
        more = f"\n  ... {len(pairs)} racing pairs in all" if len(pairs) > len(found) else ""
        raise RaceError(
            f"trident sanitizer: data race found at {where} (raised on every rank; this is "
            f"rank {self.rank}): conflicting accesses that no signal/wait, kernel boundary or "
            f"host barrier orders (replay this schedule with {SEED_ENV}={self.seed}):\n  "
            + "\n  ".join(found) + more)
