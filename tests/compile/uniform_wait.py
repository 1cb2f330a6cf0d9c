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

The Lamport wait (ccl/lamport.py) has the same rule in another form: it polls payload words
and decides from a reduction over the block, which for a block smaller than the program's
threads (copies of it, one per warp) is done inside each warp with no barrier; the decision
must then go through a program vote (bar.red.or.pred, `lamport._agree`) before any thread
stores: a warp that left the wait early cleared words another warp still polled (on one
H200, 2026-11-28: timeouts and stale words). Checked on the all-reduce kernel with a
16-element block and 4 warps: every poll load has a vote after it before the next store.

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


def lamport_problems(ptx: str) -> list[str]:
    """Poll loads (volatile, 16/32-bit words) of the Lamport wait not followed by a program
    vote before the next global store."""
    found = []
    for m in re.finditer(r"ld\.volatile\.global(?:\.v\d)?\.b(?:16|32)\b", ptx):
        vote = ptx.find("bar.red.or.pred", m.end())
        store = re.search(r"\bst\.global", ptx[m.end():])
        if vote < 0 or (store is not None and m.end() + store.start() < vote):
            found.append("a Lamport poll load with a store before its program vote")
    return found


def _lamport_ptx() -> str:
    from trident.ccl.all_reduce.lamport import _lamport_kernel
    types = {"t": "*bf16", "data": "*i16", "heads": "*i64", "lsync": "*i64", "fsync": "*i64",
             "ctrl": "*i64", "heap_bases": "*i64", "trace_buf": "*i64", "rank": "i32",
             "n": "i32", "slot": "i32", "fp": "i32"}
    constexprs = {"WORLD": 2, "OP": 0, "BLOCK": 16, "TRACE": False, "PDL": True}
    sig = {a: "constexpr" if a in constexprs else types[a] for a in _lamport_kernel.arg_names}
    return compile_ptx(_lamport_kernel, sig, constexprs, num_warps=4)


def main() -> None:
    ptx = compile_ptx(_waits, {"flags": "*i64", "ctrl": "*i64", "out": "*i64", "value": "i64",
                               "rank": "i32", "world": "i32", "fp": "i32"})
    bad = problems(ptx) + lamport_problems(_lamport_ptx())
    if bad:
        raise SystemExit("uniform_wait: " + "; ".join(sorted(set(bad))))
    print("uniform_wait: ok")


if __name__ == "__main__":
    main()
