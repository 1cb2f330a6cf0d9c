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

The package, by responsibility: log.py (the shared-memory logs: sizes and layout),
sanitizer.py (one rank's Sanitizer: clocks, recording, the programs' schedule, the
interpreter hooks), check.py (finding and reporting races in the logs: RaceError), and
install.py (switching it on and off: the interpreter patch, the Context hooks, enable,
disable, sanitizing).
"""
from .check import RaceError, SEED_ENV
from .install import ENV, disable, enable, install_auto, requested, sanitizing
from .log import MAX_PROGRAMS
from .sanitizer import PREEMPT, Sanitizer

__all__ = ["ENV", "SEED_ENV", "MAX_PROGRAMS", "PREEMPT", "RaceError", "Sanitizer", "disable",
           "enable", "install_auto", "requested", "sanitizing"]
