"""The host GEMM of the plain, sequential and pipelined schedules (ops/plain.matmul) on a
column slice whose padding holds NaN: the result must not see the padding. torch's bf16
CPU GEMM read past K on some x86 CPUs (torch 2.13), which the fuzz suite caught as NaN
rows in matmul_all_reduce / matmul_reduce_scatter with a strided a. No ranks needed."""
import pytest
import torch

from trident.ops import plain


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m,k,n", [(48, 33, 33), (31, 40, 33), (48, 3, 16), (1, 1, 5), (7, 65, 9)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_strided_operands_ignore_their_padding(dtype, m, k, n, with_bias):
    g = torch.Generator().manual_seed(m * 1000 + k * 10 + n)
    a_big = torch.full((m, k + 41), float("nan"), dtype=dtype)
    w_big = torch.full((n, k + 7), float("nan"), dtype=dtype)
    a, w = a_big[:, 5:5 + k], w_big[:, 2:2 + k]
    a.copy_(torch.randn(m, k, generator=g))
    w.copy_(torch.randn(n, k, generator=g))
    bias = torch.randn(n, generator=g) if with_bias else None
    out = torch.full((m, n), float("nan"), dtype=dtype)
    got = plain.matmul(a, w, bias, out)
    assert got is out
    ref = a.float() @ w.float().T + (0 if bias is None else bias.to(dtype).float())
    assert not got.isnan().any(), f"{int(got.isnan().sum())} NaN of {got.numel()}"
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2 * k ** 0.5)
    assert torch.equal(plain.matmul(a, w, bias), got)       # without out: the same values
