"""trident.tools.testing and the demo's checks built on it: correct bfloat16 results pass, even
where an element is near zero because its terms cancel (there the fp32 accumulation order
alone moves it by more than a bf16 unit of its own size), and wrong ones fail."""
import types

import pytest
import torch

from trident.tools.testing import assert_close, dot_magnitude, mismatch, rounding_bound
from trident.tools.demo import _check_matmul_sum, _check_sum

RANK0 = types.SimpleNamespace(rank=0)


def _shards(world, m=512, n=1024, k=512, seed=0):
    """Every rank's bf16 (a, w) for a row-parallel GEMM of the demo's GPU shape."""
    g = torch.Generator().manual_seed(seed)
    return ([torch.randn(m, k // world, generator=g).to(torch.bfloat16) for _ in range(world)],
            [torch.randn(n, k // world, generator=g).to(torch.bfloat16) for _ in range(world)])


def _other_order(a_parts, w_parts):
    """sum_r a_r @ w_r.T accumulated in another order than the reference (K in chunks of
    7, summed from the last), rounded to bf16 per rank and once more after the sum: what a
    correct fused kernel may return."""
    out = torch.zeros(a_parts[0].shape[0], w_parts[0].shape[0])
    for a, w in zip(a_parts, w_parts):
        a, w = a.float(), w.float()
        part = torch.zeros_like(out)
        for lo in reversed(range(0, a.shape[1], 7)):
            part += a[:, lo:lo + 7] @ w[:, lo:lo + 7].T
        out += part.to(torch.bfloat16).float()
    return out.to(torch.bfloat16)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_correct_gemm_passes_where_elements_cancel(world):
    a_parts, w_parts = _shards(world)
    got = _other_order(a_parts, w_parts)
    ref = sum(a.float() @ w.float().T for a, w in zip(a_parts, w_parts))
    # the case the old check failed on: near-zero elements off by more than bf16 units
    # of their own size (the fp32 accumulation order moves them)
    near_zero = ref.abs() < 1e-2
    assert ((got.float() - ref).abs() > 2 * 2.0 ** -7 * ref.abs() + 1e-6)[near_zero].any()
    _check_matmul_sum(RANK0, "gemm", got, a_parts, w_parts)


@pytest.mark.parametrize("world", [1, 2])
def test_wrong_gemm_fails(world):
    a_parts, w_parts = _shards(world, m=64, n=48, k=64)
    good = _other_order(a_parts, w_parts)
    one_term = good.clone()         # one product left out of one element
    one_term[3, 5] -= (a_parts[0][3, 0].float() * w_parts[0][5, 0].float()).to(torch.bfloat16)
    swapped = good.clone()
    swapped[[0, 1]] = good[[1, 0]]
    wrong = [one_term, swapped, good * 1.05, _other_order(a_parts[:1], w_parts[:1]) * world]
    for bad in wrong[:3] + (wrong[3:] if world > 1 else []):
        with pytest.raises(RuntimeError, match="differs from torch"):
            _check_matmul_sum(RANK0, "gemm", bad, a_parts, w_parts)


def test_sum_of_parts():
    g = torch.Generator().manual_seed(1)
    parts = [torch.randn(1000, generator=g).to(torch.bfloat16) for _ in range(3)]
    exact = sum(p.float() for p in parts)
    _check_sum(RANK0, "sum", exact.to(torch.bfloat16), parts)
    with pytest.raises(RuntimeError, match="element 7 is"):
        bad = exact.clone()
        bad[7] += 3 * parts[0][7].float().abs() + 0.1
        _check_sum(RANK0, "sum", bad.to(torch.bfloat16), parts)
    with pytest.raises(RuntimeError, match="relative error over the tensor"):
        _check_sum(RANK0, "sum", sum(p.float() for p in parts[:2]).to(torch.bfloat16), parts)


def test_mismatch_reports():
    ref = torch.tensor([1.0, -2.0, 0.0])
    assert mismatch(ref.to(torch.bfloat16), ref, 0.0) is None
    assert "shape [2]" in mismatch(ref[:2], ref, 1.0)
    assert "not finite" in mismatch(torch.tensor([1.0, float("nan"), 0.0]), ref, 1.0)
    # a zero bound asks for the exact value, also where the reference is 0
    assert "element 2 is" in mismatch(torch.tensor([1.0, -2.0, 1e-30]), ref, 0.0, rel=1.0)
    assert mismatch(torch.empty(0), torch.empty(0), 0.0) is None
    with pytest.raises(AssertionError, match="what: element 2 is 0.5, expected 0 within 0;"):
        assert_close(ref + 0.5, ref, rounding_bound(ref.abs(), 1), "what", rel=1.0)
    a, w = torch.tensor([[1.0, -2.0]]), torch.tensor([[3.0, 4.0], [-1.0, 0.5]])
    assert torch.equal(dot_magnitude(a, w), torch.tensor([[11.0, 2.0]]))
