"""FP8 dispatch: e4m3 tokens with one fp32 scale per 128 channels (the DeepEP/pplx layout).

A token row x [H] (H a multiple of 128) is cut into groups of 128 channels; group g gets

    amax[g]  = max(max |x[g, :]|, 1e-4)        (the floor keeps an all-zero group finite)
    scale[g] = amax[g] / 448                    (fp32, IEEE division)
    q[g, :]  = e4m3(x[g, :] * (448 / amax[g]))  (fp32 product, rounded to nearest even)

so that x ~= q * scale, with q in float8_e4m3fn (largest finite value 448). `quantize`
below is the same arithmetic in torch, operation for operation: the kernel's values
dequantised equal it exactly, which is what the tests check.

The sender quantises inside dispatch's send half (dispatch.py), once per destination
rank, and pushes the e4m3 bytes (packed four to an int32 word) and the scales into the
receive buffer; the receiver copies bytes, never values. The fp32 -> e4m3 rounding is
picked at import time, like trident/language's helpers: on GPUs Triton's own cast
(cvt.rn.satfinite.e4m3x2.f32 on sm_90); under the Triton interpreter (CPU emulation),
integer bit manipulation, because the interpreter's float8 cast is not exact (it
truncates, e.g. 31.5 -> 16, and flushes e4m3 subnormals to zero). Both round to nearest
even and saturate at 448; the inputs here never exceed 448 anyway.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime._env import INTERPRET

GROUP_SIZE = 128                  # channels per scale
E4M3_MAX = 448.0
AMAX_FLOOR = 1e-4                 # DeepEP's floor for an all-(near-)zero group

# the same, for kernels
GROUP = tl.constexpr(GROUP_SIZE)
SCALE_BLOCK = tl.constexpr(64)    # scales per step of the receive copy
_E4M3_MAX = tl.constexpr(E4M3_MAX)
_AMAX_FLOOR = tl.constexpr(AMAX_FLOOR)


@triton.jit
def _e4m3_bits_exact(q):
    """fp32 -> float8_e4m3fn bits (int32, 0..255) with integer operations only: round to
    nearest even, saturate finite values at 448 (0x7E), NaN -> 0x7F."""
    bits = q.to(tl.int32, bitcast=True)
    sign = tl.where(bits < 0, 0x80, 0)
    a = bits & 0x7FFFFFFF
    # normal results (|q| >= 2^-6): keep 3 of the 23 mantissa bits, rounded to nearest
    # even (a carry moves into the exponent), exponent bias 127 -> 7; above 448 saturate
    an = tl.minimum(a, 0x43F00000)                     # 480: no int32 overflow below
    r = an + 0x7FFFF + ((an >> 20) & 1)
    normal = tl.minimum((r - (120 << 23)) >> 20, 0x7E)
    # subnormal results (|q| < 2^-6): m = round(|q| * 2^9), the value m * 2^-9; m == 8
    # is 2^-6, whose bits (exponent 1, mantissa 0) are 8 as well
    man = (a & 0x7FFFFF) | 0x800000
    shift = tl.minimum(tl.maximum(141 - (a >> 23), 21), 25)   # |q| = man * 2^(e-150)
    m = man >> shift
    rem = man - (m << shift)
    half = 1 << (shift - 1)
    m += ((rem > half) | ((rem == half) & ((m & 1) == 1))).to(tl.int32)
    mag = tl.where(a >= 0x3C800000, normal, m)
    mag = tl.where(a > 0x7F800000, 0x7F, mag)
    return sign | mag


@triton.jit
def _e4m3_bits_native(q):
    """fp32 -> float8_e4m3fn bits (int32, 0..255) with the hardware conversion."""
    f8 = q.to(tl.float8e4nv, fp_downcast_rounding="rtne")
    return f8.to(tl.uint8, bitcast=True).to(tl.int32)


e4m3_bits = _e4m3_bits_exact if INTERPRET else _e4m3_bits_native


@triton.jit
def e4m3_value(bits):
    """float8_e4m3fn bits (int32, 0..255) -> fp32, exactly, with integer operations
    (the interpreter's float8 casts are not exact); NaN (0x7F, 0xFF) is never produced by
    the quantiser and is not decoded."""
    sign = (bits & 0x80) << 24
    exp = (bits >> 3) & 0xF
    man = bits & 0x7
    normal = (sign | ((exp + 120) << 23) | (man << 20)).to(tl.float32, bitcast=True)
    sub = man.to(tl.float32) * 0.001953125           # m * 2^-9, exact
    return tl.where(exp == 0, tl.where(sign != 0, -sub, sub), normal)


@triton.jit
def _bf16_exact(v):
    """fp32 -> bf16 rounded to nearest even with integer operations (the interpreter's
    cast truncates); finite inputs."""
    bits = v.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return rounded.to(tl.float32, bitcast=True).to(tl.bfloat16)


@triton.jit
def _bf16_native(v):
    return v.to(tl.bfloat16)


_to_bf16 = _bf16_exact if INTERPRET else _bf16_native


@triton.jit
def dequantized(bits, scale, dtype: tl.constexpr):
    """e4m3 bits (int32) times their scales (fp32), rounded to `dtype` to nearest even on
    every backend, as torch's dequantize(q, scale).to(dtype) is: the forwarding rank's
    re-quantisation then gives the sender's e4m3 bytes."""
    v = e4m3_value(bits) * scale
    if dtype == tl.bfloat16:
        return _to_bf16(v)
    else:
        return v.to(dtype)


@triton.jit
def quantize_groups(v, G: tl.constexpr):
    """v [G, 128] fp32 -> (words [G, 32] int32: the e4m3 bytes, four per word, the first
    in the lowest byte, as in memory; scales [G] fp32)."""
    amax = tl.maximum(tl.max(tl.abs(v), axis=1), _AMAX_FLOOR)
    inv = tl.math.div_rn(tl.full([G], _E4M3_MAX, tl.float32), amax)
    scale = tl.math.div_rn(amax, tl.full([G], _E4M3_MAX, tl.float32))
    bits = e4m3_bits(v * inv[:, None])
    b4 = tl.reshape(bits, [G, GROUP // 4, 4])
    # four disjoint bytes: their sum is their OR (also for the top byte's sign bit)
    words = tl.sum(b4 << (8 * tl.arange(0, 4))[None, None, :], axis=2)
    return words, scale


# ---------------------------------------------------------------------------- host side
def check_hidden(hidden: int, op: str = "dispatch") -> None:
    if hidden % GROUP_SIZE:
        raise ValueError(f"{op}: fp8=True needs hidden_dim to be a multiple of "
                         f"{GROUP_SIZE} (one fp32 scale per {GROUP_SIZE} channels), got "
                         f"hidden_dim = {hidden}")


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What fp8 dispatch sends for x [T, H]: (q [T, H] float8_e4m3fn, scale [T, H/128]
    fp32), the same arithmetic as the kernel, so dequantize(q, scale) equals the received
    values dequantised exactly."""
    check_hidden(x.shape[-1], "quantize")
    v = x.float().reshape(*x.shape[:-1], x.shape[-1] // GROUP_SIZE, GROUP_SIZE)
    amax = v.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    inv = torch.full_like(amax, E4M3_MAX) / amax
    scale = amax / E4M3_MAX
    q = (v * inv[..., None]).to(torch.float8_e4m3fn)
    return q.reshape(x.shape), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q [..., H] float8_e4m3fn, scale [..., H/128] fp32 -> fp32 [..., H] (q * scale)."""
    H = q.shape[-1]
    v = q.float().reshape(*q.shape[:-1], H // GROUP_SIZE, GROUP_SIZE) * scale[..., None]
    return v.reshape(q.shape)
