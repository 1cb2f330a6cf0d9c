"""The collective algorithms the tests run are trident/ccl/registry.py's: no test keeps a
list of "every algorithm" of its own, so a new algorithm -- its file and its registry
line -- is run by every test of each algorithm with no test changed
(tests/ccl/test_new_algorithm.py shows it with a throwaway one).

- `kernels(op, family)`: trident's own algorithms of `op` (registry.kernels; "nccl" is
  torch.distributed, which a test adds where it runs it), in declaration order, less
  those that EXCUSED leaves out of the test family `family`.
- `takes(op, name, dtype)`: whether the algorithm runs on tensors of that dtype (the
  registry's `dtypes`): a test's cases of every algorithm skip the dtypes it does not take.
- `cases(op, every, own)`: a test's cases, (name, *case): each case of `every` with every
  algorithm that takes its dtype (case[0]), then an algorithm's own cases (`own`, keyed
  by name).
- `schedules(family)`: likewise the fused ops' schedules of trident's own
  (trident/ops/schedules.py's registered ones, less torch's: needs_nccl), EXCUSED
  under the op "schedules".
- `declared(*algorithms)`: within a `with`, the registry with these declarations added,
  or in place of those of the same op and name. In this process only: a pool's rank
  processes declare for themselves, inside the function the pool runs.
"""
from __future__ import annotations

import contextlib

from trident.ccl import registry

# (test family, op, algorithm) -> why that family leaves the algorithm out: the one place
# where a test may leave out an algorithm of the registry. A family is named after the
# test file or test that asks; the op "schedules" names a fused-op schedule
# (tests/ccl/test_registry.py checks that every entry names an algorithm or schedule).
EXCUSED = {
    ("schedule_errors", "schedules", "pipelined"):
        "its calls whose sizes differ are tests/ops/test_pipelined.py's",
    ("sanitize", "all_gather", "gluon"):
        "runs under the race detector in tests/ccl/test_all_gather_gluon.py, with a "
        "planted Gluon race beside it",
    ("all_to_all_race_free", "all_to_all", "lamport"):
        "back to back with a flag kernel (no barrier between), a pending Lamport wait's "
        "look at a peer's flag-protocol epoch (ccl/lamport.py `_stop`, an atomic read on "
        "the emulation) races with that peer's plain store of it in the flag kernel it "
        "still runs: the detector reports it (for all_gather's lamport too)",
}


def kernels(op: str, family: str | None = None) -> list[str]:
    """The names of `op`'s own algorithms, in the registry's order, less those EXCUSED
    from `family`."""
    return [a.name for a in registry.kernels(op) if (family, op, a.name) not in EXCUSED]


def pairs(ops=registry.OPS, family: str | None = None) -> list[tuple[str, str]]:
    """(op, name) of every algorithm of `ops` (`kernels`)."""
    return [(op, name) for op in ops for name in kernels(op, family)]


def cases(op: str, every, own: dict, family: str | None = None) -> list[tuple]:
    """(name, *case) of each case of `every` (its first item a dtype) with each algorithm
    of `op` that takes that dtype, then of `own`'s ({name: its cases besides})."""
    assert set(own) <= set(kernels(op, family)), (op, own)
    out = [(name, *case) for name in kernels(op, family) for case in every
           if takes(op, name, case[0])]
    return out + [(name, *case) for name, theirs in own.items() for case in theirs]


def schedules(family: str | None = None) -> list[str]:
    """The names of trident's own fused-op schedules, in the registry's order, less those
    EXCUSED from `family`."""
    from trident.ops import schedules as registered
    return [n for n, s in registered.registered().items()
            if not s.needs_nccl and (family, "schedules", n) not in EXCUSED]


def takes(op: str, name: str, dtype) -> bool:
    """Whether `op`'s algorithm `name` runs on tensors of torch dtype `dtype`."""
    return registry.get(op, name).takes(dtype)


@contextlib.contextmanager
def declared(*algorithms: registry.Algorithm):
    """registry.ALGORITHMS with `algorithms` in it for the duration: each in place of the
    declaration of its op and name, or, if new, before the "nccl" entries (which stay
    last); restored after, whatever happened."""
    table = registry.ALGORITHMS
    new = {(a.op, a.name): a for a in algorithms}
    kept = tuple(new.pop((a.op, a.name), a) for a in table)
    first_torch = next(i for i, a in enumerate(kept) if a.engine == "torch")
    registry.ALGORITHMS = kept[:first_torch] + tuple(new.values()) + kept[first_torch:]
    try:
        yield registry.ALGORITHMS
    finally:
        registry.ALGORITHMS = table
