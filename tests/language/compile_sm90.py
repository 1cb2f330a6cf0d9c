"""Compile the foundation's kernels for sm_90 with the real Triton compiler (no GPU needed)
and check what the CPU emulation cannot: that they compile at all, and that remote copies
through `translate` keep 16-byte vector accesses. Run in a process of its own:
`python -m tests.language.compile_sm90` (the test process may be using the interpreter)."""
import os

os.environ["TRITON_INTERPRET"] = "0"          # before trident/triton pick their mode
os.environ["TRIDENT_BACKEND"] = "cuda"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
ALIGNED = [["tt.divisibility", 16]]


def compile_ptx(fn, signature, constants=None, aligned=(), num_warps=4) -> str:
    names = list(signature)
    attrs = {(names.index(a),): ALIGNED for a in aligned}
    src = ASTSource(fn, signature, constants or {}, attrs)
    return triton.compile(src, target=TARGET, options={"num_warps": num_warps}).asm["ptx"]


def main() -> None:
    from tests.language import test_rma, test_sync
    from trident import demo
    from trident.bench import p2p
    from trident.ccl import barrier
    i32, i64, p32, p64, pf = "i32", "i64", "*i32", "*i64", "*fp32"
    compile_ptx(test_rma._atomics_kernel, dict(counters=p32, values=p32, rank=i32, world_size=i32,
                                               heap_bases=p64))
    compile_ptx(test_sync._wait_for_rank1_kernel, dict(flag=p32, ok=p32, ctrl=p64, rank=i32,
                                                       heap_bases=p64))
    compile_ptx(test_sync._barrier_rounds_kernel, dict(slots=p32, errors=p32, ctrl=p64, rank=i32,
                world_size=i32, heap_bases=p64, rounds=i32))
    compile_ptx(test_sync._ping_pong_kernel, dict(flags=p32, data=p32, log=p32, ctrl=p64, rank=i32,
                                                  heap_bases=p64, rounds=i32))
    compile_ptx(test_sync._timestamp_kernel, dict(out=p64))
    compile_ptx(barrier._barrier_kernel, dict(ctrl=p64, heap_bases=p64, rank=i32, world_size=i32))
    compile_ptx(demo._counter_kernel, dict(counter=p64, rank=i32, world_size=i32, heap_bases=p64,
                                           rounds=i32))
    compile_ptx(demo._ring_kernel, dict(src=pf, dst=pf, flag=p64, ctrl=p64, rank=i32,
                world_size=i32, heap_bases=p64, n=i32, round_no=i32, BLOCK="constexpr"),
                {"BLOCK": 1024})
    for push in (True, False):
        ptx = compile_ptx(p2p._p2p_kernel, dict(src=p32, dst=p32, rank=i32, world_size=i32,
                          heap_bases=p64, n_blocks=i32, PUSH="constexpr", BLOCK="constexpr"),
                          {"PUSH": push, "BLOCK": 4096}, aligned=("src", "dst", "heap_bases"),
                          num_warps=8)
        assert "st.global.v4.b32" in ptx and "ld.global.v4.b32" in ptx, \
            "remote copy through translate lost its 16-byte vector accesses"
    print("ok")


if __name__ == "__main__":
    main()
