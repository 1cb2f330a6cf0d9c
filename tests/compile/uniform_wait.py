"""The bounded wait makes one decision per program on sm_90 (issue 29), checked in the PTX.

A program's warps poll a flag on their own and may leave the wait differently (one with
the flag, another on a timeout or a failed peer). Before the fix, `wait` branched on each
warp's own result and recorded the error inside that branch with a scalar tl.atomic_cas,
which Triton runs in thread 0 and broadcasts with program barriers (bar.sync): warps that
took the branch and warps that did not paired different barriers, and from then on a
launch's "last program" logic ran in some warps only (MoE dispatch at world 4 on an H100
left counts -1 with expert_x not poisoned). Checked here, with the real compiler:
  - between the wait's first flag load and its vote (bar.red.and.pred) there is no
    bar.sync: nothing there needs every warp;
  - no error record is a thread-0 CAS (`@%p atom...cas`): record_error runs in every
    thread that reaches it, with no barrier, so a branch some warps skip is harmless.

Run in a process of its own (tests/compile/test_sm90.py does): python -m tests.compile.uniform_wait
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "0"          # before trident/triton pick their mode
os.environ["TRIDENT_BACKEND"] = "cuda"

import re  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import trident.language as tdl  # noqa: E402
from trident.ccl.device import wait_all  # noqa: E402

from .sm90 import compile_ptx  # noqa: E402


@triton.jit
def _waits(flags, ctrl, out, value, rank, world, fp):
    ok = tdl.wait(flags, value, ctrl, rank, 1, 0)
    if tl.load(out + 1, volatile=True) != value:       # a branch on a per-thread value
        tdl.record_error(ctrl, rank, 1, 0, tdl.KIND_MISMATCH)
    ok = ok & wait_all(flags, 1, value, ctrl, rank, world, 0, fp)
    tl.store(out, ok.to(tl.int64))


def problems(ptx: str) -> list[str]:
    """What in `ptx` breaks the rule above (empty: none)."""
    found = []
    for m in re.finditer(r"ld\.acquire\.sys\.global\.b64", ptx):
        vote = ptx.find("bar.red.and.pred", m.end())
        if vote < 0:
            found.append("a flag load with no program vote (bar.red.and.pred) after it")
        elif "bar.sync" in ptx[m.end():vote]:
            found.append("a bar.sync between a wait's flag load and its vote")
    found += [f"a thread-0 CAS: {line.strip()}" for line in ptx.splitlines()
              if re.search(r"@%p\d+\s+atom\.global\.\S*cas", line)]
    return found


def main() -> None:
    ptx = compile_ptx(_waits, {"flags": "*i64", "ctrl": "*i64", "out": "*i64", "value": "i64",
                               "rank": "i32", "world": "i32", "fp": "i32"})
    bad = problems(ptx)
    if bad:
        raise SystemExit("uniform_wait: " + "; ".join(sorted(set(bad))))
    print("uniform_wait: ok")


if __name__ == "__main__":
    main()
