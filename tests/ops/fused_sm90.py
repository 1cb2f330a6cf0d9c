"""The row-parallel fused kernel (_matmul_reduce_kernel) as its TMA launches run it: a and w
as host-made TMA descriptors (gemm.host_descriptors), for sm_90 with the real compiler --
no GPU needed. Each must compile (ptxas too), use TMA copies and wgmma, and need no global
scratch: a launch with scratch gets a buffer that its plan keeps (triton_launch.Launch),
which torch.compile's cudagraph trees find in their pool when the plan was made during
their warm-up. all_gather_matmul's TMA launches still make their descriptors in the kernel
(its gathered buffer is both the pushers' pointer and the GEMM's operand): its scratch is
printed, not checked.

    python -m tests.ops.fused_sm90          (tests/ops/test_plan_retention.py runs it)
Prints one line per compilation and "fused_sm90: ok" last.
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "0"          # before trident/triton pick their mode
os.environ["TRIDENT_BACKEND"] = "cuda"

import sys  # noqa: E402

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
# configs the fused ops take on Hopper (the H200 table's small-M entries, a plain one)
CONFIGS = ("swab64x64x128_s4_w4_sk8", "swab128x64x64_s6_w4_sk8", "64x128x64_s4_w4")
POINTERS = dict(bias="*bf16", out="*bf16", partials="*bf16", result="*bf16", gathered="*bf16",
                sync="*i32", ctrl="*i64", heap_bases="*i64", trace_buf="*i64",
                k_partials="*fp32", k_counters="*i32")


def compile_kernel(fn, types: dict, constexprs: dict, cfg: dict):
    """Compile `fn` for sm_90: `types` for the arguments that have one, i32 for the other
    non-constexpr ones (sizes, strides, counts)."""
    cnames = {p.name for p in fn.params if p.is_constexpr}
    sig = {n: "constexpr" if n in cnames else types.get(n, "i32") for n in fn.arg_names}
    missing = sorted(cnames - set(constexprs))
    if missing:
        raise AssertionError(f"{fn.__name__}: no value for constexpr(s) {missing}")
    return triton.compile(ASTSource(fn, sig, constexprs, {}), target=TARGET,
                          options=dict(num_warps=cfg["num_warps"],
                                       num_stages=cfg["num_stages"]))


def main() -> int:
    from trident.runtime.errors import OP_CODES
    from trident.ops import gemm
    from trident.ops.all_gather_matmul import _all_gather_matmul_kernel
    from trident.ops.fused_tile import tile_shape
    from trident.ops.matmul_reduce_scatter import _matmul_reduce_kernel
    failures = 0
    for i, name in enumerate(CONFIGS):
        cfg = gemm.resolve(name)
        bm, bn = tile_shape(cfg)
        bk = cfg["BK"]
        split = cfg["SPLIT_K"] > 1
        all_reduce = i % 2 == 0
        types = dict(POINTERS, a=f"tensordesc<bf16[{bm},{bk}]>", w=f"tensordesc<bf16[{bn},{bk}]>")
        op = "matmul_all_reduce" if all_reduce else "matmul_reduce_scatter"
        constexprs = dict(BM=bm, BN=bn, BK=bk, GROUP_M=1, EVEN_K=True, HAS_BIAS=i == 1,
                          ALL_REDUCE=all_reduce, PERSISTENT=True, TMA=True,
                          SWAP_AB=cfg["SWAP_AB"], SPLIT=split, OP=OP_CODES[op], TRACE=False)
        c = compile_kernel(_matmul_reduce_kernel, types, constexprs, cfg)
        ptx = c.asm["ptx"]
        ok = (c.metadata.global_scratch_size == 0 and "cp.async.bulk.tensor" in ptx
              and "wgmma.mma_async" in ptx)
        failures += not ok
        print(f"{op} {name} host descriptors: global scratch "
              f"{c.metadata.global_scratch_size} B, shared {c.metadata.shared} B, TMA "
              f"{'cp.async.bulk.tensor' in ptx}, wgmma {'wgmma.mma_async' in ptx}: "
              f"{'ok' if ok else 'FAILED'}")
    cfg = gemm.resolve(CONFIGS[0])
    bm, bn = tile_shape(cfg)
    types = dict(POINTERS, a="*bf16", w="*bf16")
    c = compile_kernel(_all_gather_matmul_kernel, types, dict(
        NUM_PUSHERS=16, BM=bm, BN=bn, BK=cfg["BK"], GROUP_M=8, COPY_M=32, COPY_K=256,
        EVEN_K=True, ALIGNED=True, HAS_BIAS=False, PERSISTENT=True, TMA=True, SWAP_AB=True,
        SPLIT=True, TRACE=False), cfg)
    print(f"all_gather_matmul {CONFIGS[0]} in-kernel descriptors: global scratch "
          f"{c.metadata.global_scratch_size} B per program (not checked)")
    print("fused_sm90: ok" if not failures else f"fused_sm90: {failures} FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
