"""What a small all-reduce's kernel does, counted in its sm_90 PTX (no GPU needed): the
ordering and synchronisation instructions that set its latency -- fences, atomics, program
barriers, acquire and volatile loads, remote and local stores -- for one_shot (the flag
protocol) and lamport (the data is the flag), bf16, 4 warps, at 2 and 4 ranks.

    PYTHONPATH=. python -m bench.lab.kernel_census          # a markdown table

The counts are static (instructions in the kernel, once per loop body), not per call; the
docs/latency.md table reads them beside the measured times.
"""
from __future__ import annotations

import importlib
import os
import re

os.environ["TRITON_INTERPRET"] = "0"
os.environ["TRIDENT_BACKEND"] = "cuda"

from tests.compile import sm90  # noqa: E402

KINDS = {
    "fence (membar / fence.*)": r"\b(?:fence\.(?!proxy)[\w.]+|membar\.\w+)",
    "release/acq_rel atomics (fence inside)": r"\batom\.(?:[\w.]*\.)?(?:release|acq_rel)\b",
    "relaxed atomics": r"\batom\.(?:[\w.]*\.)?relaxed\b|(?<![.\w])red\.",
    "acquire loads": r"\bld\.acquire\.",
    "volatile loads": r"\bld\.volatile\.",
    "program barriers (bar.sync / bar.red)": r"\bbar\.(?:sync|red)",
    "nanosleep (poll back-off)": r"\bnanosleep\b",
    "16-byte stores": r"\bst\.global(?:\.[\w:]+)*\.v4\.",
    "scalar stores": r"\bst\.global(?:\.(?!v\d)[\w:]+)*\.[bsu](?:8|16|32|64)\b",
}


def _ptx(module: str, name: str, types: dict, constexprs: dict, aligned) -> str:
    fn = getattr(importlib.import_module(module), name)
    types = {**sm90.COMMON, **types}
    sig = {a: "constexpr" if a in constexprs else types[a] for a in fn.arg_names}
    pointers = [a for a in fn.arg_names if sig[a].startswith("*") or a in aligned]
    return sm90.compile_ptx(fn, sig, constexprs, pointers, num_warps=4)


def kernels(world: int):
    flags = dict(flags=sm90.P64, sync=sm90.P64)
    push = dict(scratch=sm90.PBF16, n=sm90.I32, stride=sm90.I32, half=sm90.I32, **flags)
    yield ("one_shot", _ptx("trident.ccl.all_reduce.one_shot", "_one_shot_kernel",
                            dict(t=sm90.PBF16, **push),
                            dict(OP=0, BLOCK=8192, TRACE=False), ("n", "stride", "half")))
    yield ("lamport", _ptx("trident.ccl.all_reduce.lamport", "_lamport_kernel",
                           dict(t=sm90.PBF16, data=sm90.P16, heads=sm90.P64, lsync=sm90.P64,
                                fsync=sm90.P64, n=sm90.I32, slot=sm90.I32),
                           dict(WORLD=world, OP=0, BLOCK=1024, TRACE=False), ("n", "slot")))


def main() -> None:
    rows = {}
    for world in (2, 4):
        for name, ptx in kernels(world):
            if name == "one_shot" and world == 4:
                continue          # world is a run-time argument there: one kernel for all
            rows[f"{name} (world {world})" if name == "lamport" else name] = {
                kind: len(re.findall(rx, ptx)) for kind, rx in KINDS.items()}
    names = list(rows)
    print("| instructions in the kernel | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for kind in KINDS:
        print(f"| {kind} | " + " | ".join(str(rows[n][kind]) for n in names) + " |")


if __name__ == "__main__":
    main()
