"""Race detector for device-side protocols on the CPU emulation (TRIDENT_SANITIZE=1).

The interpreter normally runs a grid's programs one after another, so a missing wait or a
buffer reused too early passes on the CPU and shows up only as a flaky GPU failure. With
the sanitizer on, every load, store and atomic a kernel makes on the symmetric heap is
recorded with a vector clock, and two accesses to the same heap bytes from different ranks
or programs, at least one a write, that no chain of release->acquire, kernel boundary or
host barrier orders, are reported as a race: a `RaceError` (message contains "race") on
every rank, at the same next `ctx.sync()` or host-side collective (`ctx.barrier()`, a
workspace's first use, `ctx.close()`). While the sanitizer is on, ctx.sync() is collective
(every rank must call it, as in an SPMD program).

Switch it on for a whole job with TRIDENT_SANITIZE=1 (TRIDENT_SANITIZE_SEED=n replays a
schedule), or for part of a program with `with trident.sanitize.sanitizing(ctx, seed):`
(collective). Off (the default) nothing of it is installed: no per-access Python at all.

How it works (details in docs/design.md, "Race detector"):

- Hooks. While on, the interpreter's memory ops (InterpreterBuilder.create_masked_load /
  create_masked_store / create_atomic_rmw / create_atomic_cas: every tl.load/tl.store and
  every tdl remote op ends there) record each access's byte ranges, mapped to (owner
  rank, heap offset). A grid runs through `_Run` instead of the interpreter's loop.
- Threads = (rank, program). Each program of a launch is a Python thread; one runs at a
  time (a baton). The start order is a seeded permutation, and a program hands the baton
  on in every `backoff()` of a wait (language/_cpu.py) and, at random (seeded, per
  program), before its memory ops. A program waiting for a peer or for any other program
  lets the others run, so every order is deadlock-free that the waits allow.
- Vector clocks: one component per (rank, program slot). A launch starts every program
  from the rank's host clock (kernel boundary), and the host clock joins every program's
  clock when the launch ends. A release (atomic with sem release/acq_rel) publishes the
  program's clock for its address in a release log, an acquire (acquire/acq_rel) joins
  the clocks of the releases whose stored value is <= the value it read (flags carry
  epochs and only grow between host barriers). A release at gpu scope orders only for
  programs of the same rank. Volatile loads count as relaxed atomic reads.
- Logs in shared memory: each rank has one /dev/shm file (mapped by every rank, unlinked
  at once) with two banks; a bank holds one generation (the span between two host-side
  collectives): kernel names, clock snapshots, accesses, releases. Every host-side
  collective on the CPU emulation is a full barrier (kernels run synchronously), so it
  ends a generation: clocks restart from zero and the other bank is used.
- Checking: a check looks at every pair of accesses logged in the generation (any
  ranks'), not only the checking rank's. At ctx.sync() each rank checks what is logged so
  far, then the ranks pool their findings in a host exchange and all raise: whichever of
  two racing accesses came second in real time finds the first, so the pool has it. The
  exchange orders nothing (clocks and generation go on: on a GPU a sync is local). At a
  host collective every rank checks after all have arrived, so all see the same complete
  logs, find the same races and raise. Pairs raised once are not raised again.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import os
import random
import threading
import time
import uuid

import numpy as np

ENV = "TRIDENT_SANITIZE"
SEED_ENV = "TRIDENT_SANITIZE_SEED"

MAX_PROGRAMS = 256            # programs of one launch the clocks have room for
PREEMPT = 0.25                # chance of handing the baton on before a memory op
_LAUNCHES = 4096              # per generation: kernel launches ...
_SEGMENTS = 16384             # ... clock snapshots ...
_ACCESSES = 1 << 19           # ... access records ...
_RELEASES = 1 << 16           # ... and release records
_NAME = 64
_HDR = 16                     # int64 header words: gen, n_acc, n_seg, n_rel, n_launch, full
_COORD = 40                   # access coordinate = owner rank << 40 | heap offset

READ, WRITE, ATOMIC = 0, 1, 2
_NEVER = np.iinfo(np.int64).max


class RaceError(RuntimeError):
    """Two accesses to the same heap bytes, at least one a write, from different ranks or
    programs, that nothing orders (found by the sanitizer, TRIDENT_SANITIZE=1)."""


class _Abort(BaseException):
    """Unwinds the other programs of a launch after one of them raised."""


def requested() -> bool:
    return os.environ.get(ENV, "0").strip().lower() not in ("", "0", "false", "no", "off")


# ---------------------------------------------------------------------- shared logs
class _Bank:
    """One generation's log of one rank, as numpy views of its shared-memory file."""

    def __init__(self, addr: int, comps: int):
        import ctypes

        def view(offset, dtype, shape):
            count = int(np.prod(shape))
            buf = (ctypes.c_uint8 * (count * np.dtype(dtype).itemsize)).from_address(addr + offset)
            return np.frombuffer(buf, dtype=dtype).reshape(shape)
        off = 0
        self.hdr = view(off, np.int64, (_HDR,)); off += _HDR * 8
        self.names = view(off, np.uint8, (_LAUNCHES, _NAME)); off += _LAUNCHES * _NAME
        self.segs = view(off, np.int32, (_SEGMENTS, comps)); off += _SEGMENTS * comps * 4
        self.acc = view(off, np.int64, (_ACCESSES, 8)); off += _ACCESSES * 64
        self.rel = view(off, np.int64, (_RELEASES, 8)); off += _RELEASES * 64
        self.size = off

    @staticmethod
    def nbytes(comps: int) -> int:
        return _HDR * 8 + _LAUNCHES * _NAME + _SEGMENTS * comps * 4 + _ACCESSES * 64 + _RELEASES * 64


class _Prog:
    __slots__ = ("pid", "idx", "tid", "vc", "seg", "rng", "sem", "alive", "last", "pos")

    def __init__(self, pid, idx, tid, vc, rng, pos):
        self.pid, self.idx, self.tid, self.vc, self.rng, self.pos = pid, idx, tid, vc, rng, pos
        self.seg = -1                 # index of the snapshot of vc in the log, -1: not made
        self.sem = threading.Semaphore(0)
        self.alive = True
        self.last = None              # the last access record (spin loops repeat it)


# ---------------------------------------------------------------------- the sanitizer
class Sanitizer:
    """One rank's state; made by `enable(ctx)`."""

    def __init__(self, ctx, addrs: list[int], size: int, seed: int):
        self.rank, self.world = ctx.rank, ctx.world_size
        self.group = ctx.group
        self.comps = self.world * MAX_PROGRAMS
        self.seed = seed
        self._addrs, self._size = addrs, size
        self.banks = [[_Bank(a, self.comps), _Bank(a + _Bank.nbytes(self.comps), self.comps)]
                      for a in addrs]
        bases = np.array(ctx._heap.bases, dtype=np.uint64)
        self.order = np.argsort(bases)
        self.sbases = bases[self.order]
        self.heap_size = int(ctx.heap_size)
        self.launches = 0             # since enable: seeds each launch's schedule
        self.gen = 0
        for b in self.banks[self.rank]:
            b.hdr[:] = 0
        self.banks[self.rank][1].hdr[0] = -1
        self._new_generation(0)
        self.current: _Prog | None = None

    # -------------------------------------------------------------- generations
    def _new_generation(self, gen: int) -> None:
        self.gen = gen
        bank = self.my = self.banks[self.rank][gen % 2]
        bank.hdr[0] = -1
        bank.hdr[1:] = 0
        bank.hdr[0] = gen
        self.host = np.zeros(self.comps, dtype=np.int32)
        self.rel_index: dict[tuple[int, int], list] = {}
        self.rel_cursor = [0] * self.world
        self.marks = [0] * self.world
        self.reported: set[tuple[int, int, int, int]] = set()   # racing pairs raised already

    def _bank(self, r: int):
        b = self.banks[r][self.gen % 2]
        return b if b.hdr[0] == self.gen else None

    # -------------------------------------------------------------- recording
    def _snapshot(self, p: _Prog) -> int:
        if p.seg < 0:
            h = self.my.hdr
            n = int(h[2])
            if n >= _SEGMENTS:
                h[5] = 1
                return -1
            self.my.segs[n] = p.vc
            h[2] = n + 1
            p.seg = n
        return p.seg

    def _record(self, p: _Prog, ptrs, mask, kind: int, value=None) -> None:
        addrs = ptrs.data
        if value is not None:
            value = np.broadcast_to(value.data, addrs.shape)
        if mask is not None:
            m = np.broadcast_to(mask, addrs.shape)
            if not m.all():
                addrs = addrs[m]
                value = None if value is None else value[m]
        addrs = np.ravel(addrs)
        if addrs.size == 0:
            return
        elem = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        i = np.searchsorted(self.sbases, addrs, side="right") - 1
        ok = i >= 0
        off = addrs - self.sbases[np.maximum(i, 0)]
        ok &= off < self.heap_size
        if not ok.all():
            addrs, i, off = addrs[ok], i[ok], off[ok]
            if addrs.size == 0:
                return
        coord = (self.order[i].astype(np.int64) << _COORD) + off.astype(np.int64)
        coord = np.unique(coord)
        if coord.size == 1 or coord[-1] - coord[0] == (coord.size - 1) * elem:
            starts, ends = coord[:1], coord[-1:] + elem
        else:
            brk = np.nonzero(np.diff(coord) != elem)[0]
            starts = coord[np.r_[0, brk + 1]]
            ends = coord[np.r_[brk, coord.size - 1]] + elem
        fp = 0
        if value is not None and starts.size == 1:
            # what a plain store wrote (one contiguous run): writes of the same bytes
            # are not reported against each other (see check)
            vals = np.ravel(value)[np.argsort(addrs, kind="stable")]
            fp = int.from_bytes(hashlib.blake2b(vals.tobytes(), digest_size=7).digest(),
                                "little") | 1
        seg = self._snapshot(p)
        key = (kind, seg, int(p.vc[p.tid]), starts.tobytes(), ends.tobytes())
        if key == p.last:             # a spin loop polling the same flag
            return
        p.last = key
        h = self.my.hdr
        n, k = int(h[1]), starts.size
        if n + k > _ACCESSES or seg < 0:
            h[5] = 1
            return
        rows = self.my.acc[n:n + k]
        rows[:, 0] = p.tid
        rows[:, 1] = p.vc[p.tid]
        rows[:, 2] = seg
        rows[:, 3] = kind
        rows[:, 4] = int(h[4]) - 1
        rows[:, 5] = starts
        rows[:, 6] = ends
        rows[:, 7] = fp
        h[1] = n + k

    def _keys(self, addrs: np.ndarray) -> list[tuple[int, int]]:
        """Sync-location keys: (owner, heap offset) on the heap, (-1 - rank, address) off it
        (memory only this rank's programs can reach)."""
        i = np.searchsorted(self.sbases, addrs, side="right") - 1
        keys = []
        for a, j in zip(addrs.tolist(), i.tolist()):
            if j >= 0 and a - int(self.sbases[j]) < self.heap_size:
                keys.append((int(self.order[j]), a - int(self.sbases[j])))
            else:
                keys.append((-1 - self.rank, a))
        return keys

    def _release_begin(self, p: _Prog, addrs, sys: bool):
        seg = self._snapshot(p)
        keys = self._keys(addrs)
        h = self.my.hdr
        n = int(h[3])
        if n + len(keys) > _RELEASES or seg < 0:
            h[5] = 1
            return None
        rows = self.my.rel[n:n + len(keys)]
        for row, (kh, kl) in zip(rows, keys):
            row[:] = (kh, kl, _NEVER, int(sys), seg, 0, self.rank, 0)
        h[3] = n + len(keys)
        return rows

    @staticmethod
    def _release_end(rows, new: np.ndarray) -> None:
        if rows is None:
            return
        rows[:, 2] = new
        rows[:, 5] = 1

    def _ingest(self) -> None:
        for r in range(self.world):
            bank = self._bank(r)
            if bank is None:
                continue
            n = int(bank.hdr[3])
            for j in range(self.rel_cursor[r], n):
                row = bank.rel[j]
                deadline = time.monotonic() + 10.0
                while row[5] == 0 and time.monotonic() < deadline:   # its atomic is in flight
                    os.sched_yield()
                self.rel_index.setdefault((int(row[0]), int(row[1])), []).append(
                    (int(row[2]), r, int(row[4]), bool(row[3])))
            self.rel_cursor[r] = n

    def _acquire(self, p: _Prog, addrs, seen: np.ndarray, sys: bool) -> None:
        self._ingest()
        changed = False
        for key, v in zip(self._keys(addrs), np.ravel(seen).astype(np.int64).tolist()):
            for value, r, seg, rsys in self.rel_index.get(key, ()):
                if value <= v and (r == self.rank or (rsys and sys)):
                    bank = self._bank(r)
                    if bank is not None:
                        np.maximum(p.vc, bank.segs[seg], out=p.vc)
                        changed = True
        if changed:
            p.seg = -1
            p.last = None

    # -------------------------------------------------------------- scheduling
    def _next(self, p: _Prog):
        order = self.progs_in_order
        n = len(order)
        for k in range(1, n + 1):
            q = order[(p.pos + k) % n]
            if q.alive:
                return q
        return None

    def _resume(self, p: _Prog) -> None:
        self.current = p
        _builder().grid_idx = p.idx
        if self.abort:
            raise _Abort()

    def switch(self) -> None:
        """Hand the baton to the next program (in the launch's order) and wait for it back."""
        p = self.current
        if p is None:
            return
        q = self._next(p)
        if q is None or q is p:
            return
        self.current = None
        q.sem.release()
        p.sem.acquire()
        self._resume(p)

    def _maybe_switch(self, p: _Prog) -> None:
        if p.rng.random() < PREEMPT:
            self.switch()

    def _body(self, p: _Prog, fn, args) -> None:
        p.sem.acquire()
        try:
            self._resume(p)
            fn(**args)
        except _Abort:
            pass
        except BaseException as e:  # noqa: BLE001 -- re-raised by run_grid
            if self.error is None:
                self.error = e
            self.abort = True
        finally:
            p.alive = False
            q = self._next(p)
            self.current = None
            if q is not None:
                q.sem.release()
            else:
                self.finished.set()

    def run_grid(self, fn, args, grid) -> None:
        nx, ny, nz = grid
        n = nx * ny * nz
        if n > MAX_PROGRAMS:
            raise RuntimeError(f"trident sanitizer: kernel {fn.__name__} launches {n} programs; "
                               f"the sanitizer's clocks have room for {MAX_PROGRAMS} per launch "
                               f"(trident.sanitize.MAX_PROGRAMS)")
        h = self.my.hdr
        launch = int(h[4])
        if launch < _LAUNCHES:
            raw = fn.__name__.encode()[:_NAME]
            self.my.names[launch] = 0
            self.my.names[launch, :len(raw)] = np.frombuffer(raw, dtype=np.uint8)
            h[4] = launch + 1
        else:
            h[5] = 1
        rng = random.Random(f"{self.seed}:{self.rank}:{self.launches}")
        self.launches += 1
        perm = list(range(n))
        rng.shuffle(perm)
        progs = {}
        for pos, pid in enumerate(perm):
            tid = self.rank * MAX_PROGRAMS + pid
            vc = self.host.copy()
            vc[tid] += 1
            idx = (pid // (ny * nz), (pid // nz) % ny, pid % nz)
            progs[pid] = _Prog(pid, idx, tid, vc, random.Random(rng.random()), pos)
        self.progs_in_order = [progs[pid] for pid in perm]
        self.abort, self.error = False, None
        self.finished = threading.Event()
        threads = [threading.Thread(target=self._body, args=(p, fn, args), daemon=True,
                                    name=f"trident-san-program{p.pid}")
                   for p in self.progs_in_order]
        for t in threads:
            t.start()
        self.progs_in_order[0].sem.release()
        self.finished.wait()
        for t in threads:
            t.join()
        for p in self.progs_in_order:
            np.maximum(self.host, p.vc, out=self.host)
        self.current, self.progs_in_order = None, []
        if self.error is not None:
            from triton.runtime.interpreter import InterpreterError
            raise InterpreterError(repr(self.error)) from self.error

    # -------------------------------------------------------------- hooks
    def on_load(self, orig, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile):
        p = self.current
        if p is None:
            return orig(ptrs, mask, other, cache_modifier, eviction_policy, is_volatile)
        self._maybe_switch(p)
        ret = orig(ptrs, mask, other, cache_modifier, eviction_policy, is_volatile)
        self._record(p, ptrs, mask.data, READ | (ATOMIC if is_volatile else 0))
        return ret

    def on_store(self, orig, ptrs, value, mask, cache_modifier, eviction_policy):
        p = self.current
        if p is None:
            return orig(ptrs, value, mask, cache_modifier, eviction_policy)
        self._maybe_switch(p)
        ret = orig(ptrs, value, mask, cache_modifier, eviction_policy)
        self._record(p, ptrs, mask.data, WRITE, value)
        return ret

    def _atomic(self, p, ptrs, mask, sem, scope, perform, new_values):
        from triton._C.libtriton import ir
        rel = sem in (ir.MEM_SEMANTIC.RELEASE, ir.MEM_SEMANTIC.ACQUIRE_RELEASE)
        acq = sem in (ir.MEM_SEMANTIC.ACQUIRE, ir.MEM_SEMANTIC.ACQUIRE_RELEASE)
        sys = scope == ir.MEM_SYNC_SCOPE.SYSTEM
        self._maybe_switch(p)
        addrs = np.ravel(ptrs.data)
        m = None if mask is None else np.ravel(np.broadcast_to(mask, ptrs.data.shape))
        live = addrs if m is None else addrs[m]
        rows = self._release_begin(p, live, sys) if rel and live.size else None
        ret = perform()
        old = np.ravel(np.broadcast_to(ret.data, ptrs.data.shape))
        if m is not None:
            old = old[m]
        if rows is not None:
            self._release_end(rows, new_values(old, m))
        self._record(p, ptrs, mask, WRITE | ATOMIC)
        if acq and live.size:
            self._acquire(p, live, old, sys)
        if rel and live.size:
            p.vc[p.tid] += 1
            p.seg = -1
            p.last = None
        return ret

    def on_atomic_rmw(self, orig, rmw_op, ptr, val, mask, sem, scope):
        p = self.current
        if p is None:
            return orig(rmw_op, ptr, val, mask, sem, scope)

        def new_values(old, m):
            from triton._C.libtriton import ir
            v = np.ravel(np.broadcast_to(val.data, ptr.data.shape))
            v = v if m is None else v[m]
            O = ir.ATOMIC_OP
            if rmw_op in (O.ADD, O.FADD):
                new = old + v
            elif rmw_op == O.XCHG:
                new = v
            elif rmw_op in (O.MAX, O.UMAX):
                new = np.maximum(old, v)
            elif rmw_op in (O.MIN, O.UMIN):
                new = np.minimum(old, v)
            elif rmw_op == O.AND:
                new = old & v
            elif rmw_op == O.OR:
                new = old | v
            else:
                new = old ^ v
            return np.asarray(new).astype(np.int64)
        return self._atomic(p, ptr, mask.data, sem, scope,
                            lambda: orig(rmw_op, ptr, val, mask, sem, scope), new_values)

    def on_atomic_cas(self, orig, ptr, cmp, val, sem, scope):
        p = self.current
        if p is None:
            return orig(ptr, cmp, val, sem, scope)

        def new_values(old, m):
            c = np.ravel(np.broadcast_to(cmp.data, ptr.data.shape))
            v = np.ravel(np.broadcast_to(val.data, ptr.data.shape))
            # a failed CAS writes nothing: no release to synchronise with
            return np.where(old == c, v.astype(np.int64), _NEVER)
        return self._atomic(p, ptr, None, sem, scope, lambda: orig(ptr, cmp, val, sem, scope),
                            new_values)

    # -------------------------------------------------------------- checking
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

    # -------------------------------------------------------------- host events
    def on_sync(self, exchange) -> None:
        """ctx.sync() under the sanitizer is collective, so that an SPMD program meets a race
        at the same call on every rank (not one rank at its sync and the others in a later
        barrier's timeout): each rank checks the logs as far as it sees them, then the
        ranks pool what they found through `exchange` (Context.host_exchange without the
        sanitizer's hook: a sync neither ends a generation nor orders anything). The rank
        that made the later of two racing accesses has logged it before its sync, and it
        sees the earlier one, so the race is in the pool. The generation goes on."""
        full = bool(self._full_logs())
        pairs, found = ([], []) if full else self.check()
        table, _ = exchange("ctx.sync()", [len(pairs), int(full)])
        if any(row[1] for row in table):
            self._raise_if_full()     # on every rank: the full log is visible to all by now
        if any(row[0] for row in table):
            import torch.distributed as dist
            everyone = [None] * self.world
            dist.all_gather_object(everyone, (pairs, found), group=self.group)
            pairs = sorted({p for theirs, _ in everyone for p in theirs})
            found = list(dict.fromkeys(d for _, theirs in everyone for d in theirs))[:4]
        self.reported.update(pairs)   # a program that catches it is not told again
        self.raise_if(pairs, found, "ctx.sync()")

    def on_host_collective(self, what: str) -> None:
        """Every rank has arrived, the generation's logs are complete and no rank writes them
        any more: every rank finds the same races (and raises), then starts the next one."""
        try:
            pairs, found = self.check()
        finally:
            self._new_generation(self.gen + 1)
        self.raise_if(pairs, found, f"host-side collective '{what}'")


# ---------------------------------------------------------------------- install / enable
_active: Sanitizer | None = None
_orig: dict = {}


def _builder():
    from triton.runtime import interpreter as _interp
    return _interp.interpreter_builder


def _install(san: Sanitizer) -> None:
    global _active
    from triton.runtime import interpreter as _interp

    from .language import _cpu
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

    from .language import _cpu
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
    module does not import trident.context) call the sanitizer of a context that has one
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
        elif requested() and not getattr(self, "_sanitize_auto", False) and self.backend == "cpu":
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

    from .heap.cpu import SHM_DIR, _libc, _map
    if ctx.backend != "cpu":
        raise RuntimeError("the trident sanitizer runs on the CPU emulation only "
                           "(TRITON_INTERPRET=1 / TRIDENT_BACKEND=cpu)")
    if getattr(ctx, "_sanitizer", None) is not None:
        return ctx._sanitizer
    if _active is not None:
        raise RuntimeError("the trident sanitizer is already on for another context of this "
                           "process")
    if seed is None and os.environ.get(SEED_ENV):
        seed = int(os.environ[SEED_ENV])
    info = [(uuid.uuid4().hex[:8], random.randrange(1 << 31) if seed is None else seed)]
    dist.broadcast_object_list(info, src=dist.get_global_rank(ctx.group, 0), group=ctx.group)
    nonce, seed = info[0]
    job = os.environ.get("TRIDENT_JOB_ID") or "nojob"
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
    from .heap.cpu import _libc
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
