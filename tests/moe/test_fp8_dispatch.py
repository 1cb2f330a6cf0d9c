"""FP8 dispatch (dispatch(..., fp8=True)) against a dequantised reference.

Every rank builds the inputs of all ranks from one seed. The rows an expert receives,
as (e4m3 bytes, scale bits), must be exactly the rows `trident.moe.fp8.quantize` makes of
the tokens routed to it (so dequantised they equal the sender-side quantise->dequantise
bit for bit), and close to the original tokens within e4m3 precision. Combine after an
fp8 dispatch stays in the object's dtype.
"""
from collections import Counter

import pytest
import torch
import triton
import triton.language as tl

import trident as td
from trident.runtime.launch import default_backend
from trident.moe import fp8

from .test_expert_parallel import _check_combine, _expert_fn, _round_inputs, extreme_counts


def _row_key(q, s):
    return q.contiguous().view(torch.uint8).numpy().tobytes() + \
        s.contiguous().view(torch.int32).numpy().tobytes()


def _check_fp8_dispatch(ctx, d, ranks, L, H):
    assert d.expert_x.dtype == torch.float8_e4m3fn and d.expert_x_scale.dtype == torch.float32
    assert tuple(d.expert_x_scale.shape) == (*d.expert_x.shape[:2], H // 128)
    cnt = d.expert_num_tokens.cpu()
    ref = [fp8.quantize(x) for (T, x, idx, w) in ranks]
    for le in range(L):
        e = ctx.rank * L + le
        routed = [(r, t) for r, (T, x, idx, w) in enumerate(ranks) for t in range(T)
                  if e in idx[t].tolist()]
        want = Counter(_row_key(ref[r][0][t], ref[r][1][t]) for r, t in routed)
        n = int(cnt[le])
        assert n == len(routed), f"expert {e}: {n} rows, expected {len(routed)}"
        q, s = d.expert_x[le, :n].cpu(), d.expert_x_scale[le, :n].cpu()
        got = Counter(_row_key(q[i], s[i]) for i in range(n))
        assert got == want, f"expert {e}: received e4m3 rows/scales differ from the reference"
        # dequantised: within e4m3 precision of the original tokens (3 mantissa bits:
        # relative error <= 2^-4; subnormals: absolute error <= 2^-10 * scale)
        if n:
            deq = fp8.dequantize(q, s)
            orig = torch.stack([ranks[r][1][t] for r, t in routed]).float()
            order = [next(i for i, (r, t) in enumerate(routed)
                          if _row_key(ref[r][0][t], ref[r][1][t]) == _row_key(q[j], s[j]))
                     for j in range(n)]
            err = (deq - orig[order]).abs()
            bound = orig[order].abs() * 2.0 ** -4 + s.repeat_interleave(128, dim=1) * 2.0 ** -10
            assert bool((err <= bound).all()), f"expert {e}: dequantised rows too far off"


def _run_experts_fp8(ctx, d, L, a, b, dtype):
    """The test's experts on the dequantised rows, out in `dtype`."""
    E_, cap, H = d.expert_x.shape
    ey = torch.zeros(L, cap, H, dtype=dtype, device=ctx.device)
    cnt = d.expert_num_tokens.cpu()
    for le in range(L):
        n = int(cnt[le])
        deq = fp8.dequantize(d.expert_x[le, :n], d.expert_x_scale[le, :n])
        ey[le, :n] = _expert_fn(deq.cpu(), ctx.rank * L + le, a, b, dtype).to(ctx.device)
    return ey


def _fp8_rounds(ctx, E, k, H, M, dtype, seeds, split=False, one_expert=False):
    E = max(E // ctx.world_size, 1) * ctx.world_size
    ep = td.ExpertParallel(ctx, E, k, H, M, dtype=dtype)
    L = E // ctx.world_size
    try:
        for i, seed in enumerate(seeds):
            counts = extreme_counts(ctx.world_size, M) if i == 0 else None
            ranks, a, b = _round_inputs(seed, ctx.world_size, E, k, H, M, dtype, counts)
            if one_expert:        # every token of every rank to expert 1 (and k-1 others)
                ranks = [(T, x, _distinct(torch.cat([torch.ones(T, 1, dtype=idx.dtype),
                                                     idx[:, 1:]], 1), E), w)
                         for (T, x, idx, w) in ranks]
            if i % 2 == 1:        # a token with a zero group and one of tiny values
                ranks = [(T, _edge_rows(x), idx, w) for (T, x, idx, w) in ranks]
            T, x, idx, w = ranks[ctx.rank]
            x, idx, w = x.to(ctx.device), idx.to(ctx.device), w.to(ctx.device)
            early = i % 3 == 2    # weights with the tokens
            if split:
                d = ep.dispatch(x, idx, wait=False, fp8=True,
                                topk_weights=w if early else None).wait()
            else:
                d = ep.dispatch(x, idx, fp8=True, topk_weights=w if early else None)
            _check_fp8_dispatch(ctx, d, ranks, L, H)
            ey = _run_experts_fp8(ctx, d, L, a, b, dtype)
            y = ep.combine(ey, d, None if early else w)
            xq = fp8.dequantize(*fp8.quantize(x.cpu()))     # what the experts saw
            _check_combine(y, T, xq, idx.cpu(), w.cpu(), a, b, dtype)
            if i == 0:            # a plain dispatch in between: its own buffers, still right
                d2 = ep.dispatch(x, idx)
                y2 = ep.combine(d2.expert_x, d2, w)
                torch.testing.assert_close(
                    y2.float().cpu(), (w.sum(1, keepdim=True) * x.float()).cpu(),
                    atol=3e-2, rtol=3e-2)
        ctx.barrier()
    finally:
        ep.close()


def _distinct(idx, E):
    """Make each token's ids distinct again after forcing column 0 (keeps column 0)."""
    idx = idx.clone()
    for t in range(idx.shape[0]):
        seen = {int(idx[t, 0])}
        for j in range(1, idx.shape[1]):
            e = int(idx[t, j])
            while e in seen:
                e = (e + 1) % E
            idx[t, j] = e
            seen.add(e)
    return idx


def _edge_rows(x):
    x = x.clone()
    if x.shape[0] >= 1:
        x[0, :128] = 0                       # amax below the floor: scale 1e-4 / 448
    if x.shape[0] >= 2:
        x[1, -128:] *= 1e-6                  # tiny values: e4m3 subnormals
    return x


@pytest.mark.parametrize("E,k,H,dtype", [
    (12, 3, 384, torch.bfloat16),     # 3 groups, several experts per rank
    (8, 2, 256, torch.float16),
], ids=["e12k3h384-bf16", "e8k2h256-fp16"])
def test_fp8_round_trip(pool, E, k, H, dtype):
    pool.run(_fp8_rounds, E, k, H, 5, dtype, [41, 42, 43])


def test_fp8_split_mode(pool):
    pool.run(_fp8_rounds, 12, 2, 128, 4, torch.bfloat16, [51, 52, 53], True)


def test_fp8_all_tokens_to_one_expert(pool):
    pool.run(_fp8_rounds, 8, 2, 256, 6, torch.bfloat16, [61, 62], False, True)


def _hidden_not_multiple(ctx):
    ep = td.ExpertParallel(ctx, max(2 * ctx.world_size, 3), 2, 96, 4)   # idx names 0-2
    try:
        x = torch.randn(3, 96, device=ctx.device).to(torch.bfloat16)
        idx = torch.tensor([[0, 1], [1, 2], [0, 2]], device=ctx.device)
        with pytest.raises(ValueError, match="multiple of 128"):
            ep.dispatch(x, idx, fp8=True)
        d = ep.dispatch(x, idx)              # nothing was launched: a plain round works
        ep.combine(d.expert_x, d, torch.rand(3, 2, device=ctx.device))
        ctx.barrier()
    finally:
        ep.close()


def test_fp8_needs_hidden_multiple_of_128(pool):
    pool.run(_hidden_not_multiple)


@triton.jit
def _bits_kernel(x, y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(y + o, fp8.e4m3_bits(tl.load(x + o, mask=m, other=0.0)), mask=m)


def test_e4m3_rounding_matches_torch():
    """The kernel's fp32 -> e4m3 (bit manipulation on the CPU emulation, the hardware
    cast on GPUs) equals torch's cast: every e4m3 value, every midpoint between two and
    its neighbours (ties to even), subnormals, random values over many binades."""
    dev = "cuda" if default_backend() == "cuda" else "cpu"
    g = torch.Generator().manual_seed(0)
    vals = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    vals = vals[~vals.isnan()].sort().values
    mids = (vals[1:] + vals[:-1]) / 2
    inf = torch.tensor(float("inf"))
    x = torch.cat([vals, mids, mids.nextafter(inf), mids.nextafter(-inf),
                   torch.randn(20000, generator=g) * torch.exp(torch.randn(20000, generator=g) * 4),
                   torch.tensor([0.0, -0.0, 1e-45, -1e-40, 448.0, -448.0, 460.0, 464.0])])
    x = x[x.abs() <= 464]
    y = torch.empty(x.numel(), dtype=torch.int32, device=dev)
    _bits_kernel[(triton.cdiv(x.numel(), 1024),)](x.to(dev), y, x.numel(), BLOCK=1024)
    ref = x.to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int32)
    assert torch.equal(y.cpu(), ref)
