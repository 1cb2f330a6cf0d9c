"""Compile the MoE kernels for sm_90 with the real Triton compiler (no GPU needed): what the
CPU emulation cannot check is that they compile at all, and that the token copies keep
16-byte vector accesses. Run in a process of its own: `python -m tests.moe.compile_sm90`.
PART=BOTH (the fused launch) holds both halves' code; the split launches are subsets."""
import re

from tests.language.compile_sm90 import compile_ptx   # sets the GPU mode before trident

I32, P32, P64, PF, PB, C = "i32", "*i32", "*i64", "*fp32", "*bf16", "constexpr"
SHAPE = dict(H=7168, K=8, KP=8, WP=8, BLOCK_H=1024)     # DeepSeek-V3, 8 ranks


def _vector_copies(ptx: str, what: str) -> None:
    for op in ("ld", "st"):
        assert re.search(rf"{op}\.global(\.\w+)*\.v4", ptx), \
            f"{what}: token copies lost their 16-byte vector accesses ({op})"


def main() -> None:
    from trident.moe import buffers as B
    from trident.moe.combine import combine_kernel
    from trident.moe.dispatch import dispatch_kernel
    for ids in ("*i64", "*i32"):
        sig = dict(x=PB, stride_x=I32, topk_idx=ids, stride_it=I32, stride_ik=I32,
                   topk_weights=PF, stride_wt=I32, stride_wk=I32, num_tokens=I32, tokens=PB,
                   meta=P32, dweights=PF, flags=P64, state=P64, slot_counter=P32,
                   send_slot=P32, expert_counter=P32, token_rows=P32, recv_count=P32,
                   expert_x=PB, expert_num_tokens=P32, ctrl=P64, heap_bases=P64,
                   trace_buf=P64, rank=I32, world=I32, max_tokens=I32, experts_per_rank=I32,
                   num_experts=I32, cap=I32, check_ids=I32, send_programs=I32, PART=C, H=C,
                   K=C, KP=C, WP=C, HAS_WEIGHTS=C, BLOCK_L=C, BLOCK_H=C, TRACE=C)
        ptx = compile_ptx(dispatch_kernel, sig,
                          dict(SHAPE, PART=B.BOTH.value, HAS_WEIGHTS=ids == "*i64",
                               BLOCK_L=32, TRACE=ids == "*i32"),
                          aligned=("x", "stride_x", "tokens", "expert_x", "heap_bases"))
        _vector_copies(ptx, "dispatch_kernel")
    for at_dispatch in (False,):          # True only leaves the weight programs out
        sig = dict(expert_y=PB, stride_ye=I32, stride_yr=I32, topk_weights=PF, stride_wt=I32,
                   stride_wk=I32, out=PB, num_tokens=I32, send_slot=P32, token_rows=P32,
                   recv_count=P32, weights=PF, partial=PB, flags=P64, state=P64, ctrl=P64,
                   heap_bases=P64, trace_buf=P64, rank=I32, world=I32, max_tokens=I32,
                   cap=I32, num_weight_programs=I32, send_programs=I32, PART=C, H=C, K=C,
                   KP=C, WP=C, WEIGHTS_AT_DISPATCH=C, BLOCK_T=C, BLOCK_H=C, TRACE=C)
        ptx = compile_ptx(combine_kernel, sig,
                          dict(SHAPE, PART=B.BOTH.value, WEIGHTS_AT_DISPATCH=at_dispatch,
                               BLOCK_T=64, TRACE=True),
                          aligned=("expert_y", "stride_ye", "stride_yr", "out", "partial",
                                   "heap_bases"))
        _vector_copies(ptx, "combine_kernel")
    print("ok")


if __name__ == "__main__":
    main()
