"""One rank's race detector (see trident/sanitize/__init__.py): vector clocks, the records
of every heap access and release, the seeded schedule of a launch's programs (one Python
thread each, one running at a time), and the hooks that the interpreter's memory ops
call. The checks are check.py's (Checking); switching it on is install.py's."""
from __future__ import annotations

import hashlib
import os
import random
import threading
import time

import numpy as np

from .check import Checking
from .log import (_ACCESSES, _COORD, _LAUNCHES, _NAME, _NEVER, _RELEASES, _SEGMENTS, ATOMIC,
                  MAX_PROGRAMS, READ, WRITE, _Bank)

PREEMPT = 0.25                # chance of handing the baton on before a memory op


class _Abort(BaseException):
    """Unwinds the other programs of a launch after one of them raised."""


def _builder():
    from triton.runtime import interpreter as _interp
    return _interp.interpreter_builder


class _Prog:
    __slots__ = ("pid", "idx", "tid", "vc", "seg", "rng", "sem", "alive", "last", "pos")

    def __init__(self, pid, idx, tid, vc, rng, pos):
        self.pid, self.idx, self.tid, self.vc, self.rng, self.pos = pid, idx, tid, vc, rng, pos
        self.seg = -1                 # index of the snapshot of vc in the log, -1: not made
        self.sem = threading.Semaphore(0)
        self.alive = True
        self.last = None              # the last access record (spin loops repeat it)



class Sanitizer(Checking):
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
        # heap ranges synchronised by values (Context.value_synchronised), kept live
        self.exempt = ctx.__dict__.setdefault("_value_synchronised", [])
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
        for lo, size in self.exempt:
            ok &= (off < lo) | (off >= lo + size)
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

