"""trident/ops/gemm.py against torch on random data: the TMA path and the pointer path
(tensors TMA cannot address), odd shapes, bias, out=, fp16/bf16, and the fp32 error.
Runs in this process (no ranks); under the interpreter on a CPU, compiled on a GPU."""
import pytest
import torch

from trident.ops import gemm

from .reference import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(m, n, k, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(dtype).to(DEVICE)
    w = torch.randn(n, k, generator=g).to(dtype).to(DEVICE)
    return a, w


# (M, N, K): blocks of the interpreter config are 16 x 32 x 32; persistent programs take
# several tiles each (3 programs there)
@pytest.mark.parametrize("m,n,k", [(64, 96, 64), (37, 48, 40), (1, 40, 64), (70, 24, 8),
                                   (33, 45, 17), (5, 7, 3)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_values(m, n, k, dtype):
    a, w = _inputs(m, n, k, dtype, m * 1000 + n * 10 + k)
    out = gemm.matmul(a, w)
    assert out.shape == (m, n) and out.dtype == dtype
    assert_close(out, a.float() @ w.float().T, f"{m}x{n}x{k} {dtype}")


def test_tma_and_pointer_paths_agree():
    a, w = _inputs(48, 64, 96, torch.bfloat16, 3)
    assert gemm.tma_compatible(a, w)
    tma = gemm.matmul(a, w, tma=True)
    ptr = gemm.matmul(a, w, tma=False)
    assert_close(tma, a.float() @ w.float().T, "tma")
    assert_close(ptr, a.float() @ w.float().T, "pointer")
    with pytest.raises(ValueError, match="TMA needs"):
        a2, w2 = _inputs(48, 64, 33, torch.bfloat16, 4)  # rows of 66 bytes
        gemm.matmul(a2, w2, tma=True)


def test_bias_out_and_strided_rows():
    a_big, w = _inputs(40, 48, 80, torch.bfloat16, 5)
    a = a_big[:, :64]                                   # row stride 80, K 64
    w = w[:, :64].contiguous()
    for bias in (torch.randn(48).to(DEVICE), torch.randn(48).to(torch.bfloat16).to(DEVICE)):
        out = torch.full((40, 48), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        got = gemm.matmul(a, w, bias=bias, out=out)
        assert got is out
        assert_close(out, a.float() @ w.float().T + bias.float(), f"bias {bias.dtype}")


def test_back_to_back_shapes():
    """Different shapes one after another, and one shape again with new data."""
    for i, (m, n, k) in enumerate([(40, 48, 64), (17, 24, 32), (40, 48, 64)]):
        a, w = _inputs(m, n, k, torch.float16, 50 + i)
        assert_close(gemm.matmul(a, w), a.float() @ w.float().T, f"call {i}")


def test_errors():
    a, w = _inputs(8, 16, 32, torch.bfloat16, 7)
    with pytest.raises(TypeError, match=r"float32; trident's GEMM takes bfloat16 or float16"):
        gemm.matmul(a.float(), w.float())
    with pytest.raises(TypeError, match="must match"):
        gemm.matmul(a, w.half())
    with pytest.raises(ValueError, match="K differ"):
        gemm.matmul(a, w[:, :16])
    with pytest.raises(ValueError, match="bias must be"):
        gemm.matmul(a, w, bias=torch.zeros(5, device=DEVICE))
    with pytest.raises(ValueError, match="out must be"):
        gemm.matmul(a, w, out=torch.empty(8, 8, dtype=torch.bfloat16, device=DEVICE))


def test_table_lookup():
    """Every shape class has an entry, each entry names a candidate, look-up is direct."""
    table = gemm.load_table()
    assert sorted(table) == sorted(gemm.all_classes())
    assert gemm.shape_class(256, 5120, 8192) == "m512-nbig-kbig"
    assert gemm.shape_class(8192, 4096, 2048) == "mbig-n4096-k4096"
    for cfg in table.values():
        assert cfg in gemm.CANDIDATES.values()
