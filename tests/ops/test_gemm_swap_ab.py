"""Swap-AB in trident/ops/gemm.py (the small-M configs: the kernel computes out.T =
w @ a.T and stores each tile transposed) against torch on random data: M=1, M and N not
multiples of the tile, K not a multiple of BK, bias (bf16 and fp32), fp16, split-K, out=,
on the pointer path and the TMA path with host-side and in-kernel descriptors. Runs in
this process; under the interpreter on a CPU, compiled on a GPU."""
import pytest
import torch

from trident.ops import gemm

from .reference import assert_close, make

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the interpreter's tiles (BM 16 over N, BN 32 over M, BK 32); a GPU runs a real candidate
SWAP = dict(gemm.INTERPRET_CONFIG, SWAP_AB=True) if gemm.INTERPRET else \
    gemm.CANDIDATES["swab128x64x64_s6_w4_sk8"]


def _paths(a, w, n):
    aligned = gemm.tma_compatible(a, w) and n % 8 == 0
    return [dict(tma=False)] + ([dict(tma=True, desc="host"), dict(tma=True, desc="kernel")]
                                if aligned else [])


@pytest.mark.parametrize("m,n,k", [(1, 40, 64), (37, 48, 200), (33, 45, 17), (64, 96, 64),
                                   (5, 7, 3), (70, 24, 40)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_swap_ab_values(m, n, k, dtype):
    a, w = make((m, k), m * 31 + k, dtype, DEVICE), make((n, k), n * 17 + k, dtype, DEVICE)
    bias = make((n,), n + 1, dtype if m % 2 else torch.float32, DEVICE)
    ref = a.float() @ w.float().T
    for path in _paths(a, w, n):
        for split in (1, 2, 3):
            got = gemm.matmul(a, w, config=SWAP, split_k=split, **path)
            assert got.shape == (m, n) and got.dtype == dtype
            assert_close(got, ref, f"{m}x{n}x{k} split {split} {path}")
            with_bias = gemm.matmul(a, w, bias=bias, config=SWAP, split_k=split, **path)
            assert_close(with_bias, ref + bias.float(), f"bias {m}x{n}x{k} split {split} {path}")


def test_swap_ab_agrees_with_plain_and_is_deterministic():
    """Swap-AB and the plain kernel take the same K steps in the same order, so with one
    slice they agree to fp32 rounding of the tile's sums; split-K is deterministic
    (bitwise the same output call after call) and leaves its counters at 0."""
    a, w = make((24, 96), 1, torch.bfloat16, DEVICE), make((80, 96), 2, torch.bfloat16, DEVICE)
    plain = gemm.matmul(a, w, split_k=1)
    swap = gemm.matmul(a, w, config=SWAP, split_k=1)
    assert_close(swap, a.float() @ w.float().T, "swap")
    assert (swap.float() - plain.float()).abs().max() <= 2e-2 * plain.float().abs().max()
    first = gemm.matmul(a, w, config=SWAP, split_k=3)
    for _ in range(2):
        assert torch.equal(gemm.matmul(a, w, config=SWAP, split_k=3), first)
    assert all(int(c.abs().sum()) == 0 for _, c in gemm._split_workspaces.values())


def test_swap_ab_out_and_strided_rows():
    a_big = make((40, 80), 5, torch.bfloat16, DEVICE)
    a = a_big[:, :64]                                    # row stride 80, K 64
    w = make((48, 64), 6, torch.bfloat16, DEVICE)
    bias = make((48,), 7, torch.bfloat16, DEVICE)
    out = torch.full((40, 48), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    assert gemm.matmul(a, w, bias=bias, out=out, config=SWAP, split_k=2) is out
    assert_close(out, a.float() @ w.float().T + bias.float(), "strided a, out=")


def test_swap_ab_launch_and_split_choice():
    """The launch passes w as the kernel's a (its descriptor's block [BM, BK]) and the
    tiles count N in BM rows; split_k_for counts the same tiles; warp specialisation
    with swap-AB is refused."""
    a, w = make((16, 64), 3, torch.bfloat16, DEVICE), make((96, 64), 4, torch.bfloat16, DEVICE)
    out = torch.empty(16, 96, dtype=torch.bfloat16, device=DEVICE)
    grid, args, kwargs = gemm.launch_args(a, w, None, out, config=SWAP, tma=True, split_k=1)
    assert kwargs["SWAP_AB"] and args[6:8] == (96, 16)
    assert list(args[0].block_shape) == [SWAP["BM"], SWAP["BK"]]
    assert list(args[0].shape) == [96, 64] and list(args[1].shape) == [16, 64]
    assert grid[0] == min(-(-96 // SWAP["BM"]) * -(-16 // SWAP["BN"]), gemm.num_sms(a.device))
    with pytest.raises(ValueError, match="both swap-AB"):
        gemm.matmul(a, w, config=dict(SWAP, WARP_SPECIALIZE=True))
    # 64 x 8192 x 8192 at 132 SMs: 64 tiles of 128 x 64, too few alone: two slices or more
    swab = gemm.CANDIDATES["swab128x64x64_s6_w4_sk8"]
    assert 2 <= gemm.split_k_for(64, 8192, 8192, swab, 132) <= 8
    # the same config without swap would count 8192 / 64 = 128 column tiles of one row
    assert gemm.split_k_for(64, 8192, 8192, dict(swab, SWAP_AB=False), 132) == \
        gemm.split_k_for(8192, 64, 8192, swab, 132)
    assert gemm.split_k_for(8192, 8192, 4096, swab, 132) == 1
