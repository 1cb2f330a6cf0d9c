"""Checking a low-precision result against an fp32 reference, with a tolerance that scales
with the magnitudes that went into each element rather than with the element itself.

An element of a sum (a reduction over ranks, a dot product of a GEMM) can be near zero
because its terms cancel, while the rounding errors on the way scale with the terms:
  - a rounding to a format moves a value v by at most UNIT[format] * |v| (so the
    roundings of partial sums, e.g. per-rank GEMM partials or a bf16 ring all-reduce,
    scale with the partials' magnitudes);
  - accumulating K products in fp32 errs by at most about K * UNIT[fp32] times
    sum_k |a_ik| |w_jk| (`dot_magnitude`), however small the sum itself is.
Callers build the elementwise bound from these (`rounding_bound`) and `mismatch` compares
with it. A relative error over the whole tensor (against the reference's norm) is checked
too: a missing, doubled or misplaced part exceeds it even where every element alone
might pass. `trident demo` and the tests use this module.
"""
from __future__ import annotations

import torch

# The relative error of one rounding to each format as truncation errs (the Triton
# interpreter truncates fp32 -> bf16; torch and GPUs round to nearest, half of it; GPU
# tensor cores' fp32 accumulation may truncate too).
UNIT = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 2.0 ** -23}


def rounding_bound(magnitude, roundings: float, dtype: torch.dtype = torch.bfloat16):
    """How far `roundings` roundings to `dtype` of values at most `magnitude` (a tensor,
    elementwise, or a number) can move a result: roundings * UNIT[dtype] * magnitude.
    For K products accumulated in fp32, roundings = K and magnitude = dot_magnitude."""
    return roundings * UNIT[dtype] * magnitude


def dot_magnitude(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_k |a_ik| |w_jk| for a @ w.T, in fp32 on the CPU: what the accumulation errors
    of element (i, j) of a GEMM scale with (not |(a @ w.T)_ij|)."""
    return a.float().abs().cpu() @ w.float().abs().cpu().T


def mismatch(got: torch.Tensor, ref: torch.Tensor, bound, rel: float = 2e-2) -> str | None:
    """None if `got` matches `ref` (fp32): finite, the same shape, every element within
    `bound` (a tensor broadcastable to ref's shape, or a number), and a relative error
    over the tensor, |got - ref| / |ref| (Frobenius norms), below `rel`. Else a sentence
    that says where it differs most."""
    got, ref = got.detach().float().cpu(), ref.detach().float().cpu()
    if got.shape != ref.shape:
        return f"shape {list(got.shape)}, expected {list(ref.shape)}"
    if not got.numel():
        return None
    if not torch.isfinite(got).all():
        i = (~torch.isfinite(got)).flatten().nonzero()[0].item()
        return f"element {i} is {got.flatten()[i].item()} (not finite)"
    diff = (got - ref).abs()
    bound = torch.as_tensor(bound, dtype=torch.float32).cpu().expand(ref.shape)
    tiny = torch.finfo(torch.float32).tiny
    err = (diff.norm() / ref.norm().clamp_min(tiny)).item()
    if (diff <= bound).all() and err < rel:
        return None
    i = (diff / bound.clamp_min(tiny)).flatten().argmax().item()
    return (f"element {i} is {got.flatten()[i].item():.4g}, expected "
            f"{ref.flatten()[i].item():.4g} within {bound.flatten()[i].item():.3g}; relative "
            f"error over the tensor {err:.2e} (allowed {rel:.0e})")


def assert_close(got: torch.Tensor, ref: torch.Tensor, bound, what: str,
                 rel: float = 2e-2) -> None:
    """AssertionError naming `what` unless mismatch(got, ref, bound, rel) is None."""
    problem = mismatch(got, ref, bound, rel)
    if problem is not None:
        raise AssertionError(f"{what}: {problem}")
