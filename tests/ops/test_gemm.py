"""trident/ops/gemm.py against torch on random data: the TMA path (host-side and in-kernel
descriptors) and the pointer path (tensors TMA cannot address), split-K (deterministic,
counters rearmed across calls), odd shapes, bias, out=, fp16/bf16, and the fp32 error.
Runs in this process (no ranks); under the interpreter on a CPU, compiled on a GPU."""
import pytest
import torch

from trident.ops import gemm, gemm_configs

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


# split-K: the interpreter config's BK is 32, so K=200 has 7 BK-steps (not a multiple of
# split * BK; slices of 2 and 3 steps, the last one partial), K=8 one step (empty slices)
@pytest.mark.parametrize("m,n,k,split", [(37, 48, 200, 3), (1, 40, 64, 2), (64, 96, 128, 4),
                                         (33, 45, 17, 2), (20, 24, 8, 3)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_split_k_values(m, n, k, split, dtype):
    a, w = _inputs(m, n, k, dtype, m * 7 + n * 3 + k + split)
    bias = torch.randn(n).to(dtype).to(DEVICE)
    ref = a.float() @ w.float().T + bias.float()
    paths = [dict(tma=False)] + ([dict(tma=True, desc="host"), dict(tma=True, desc="kernel")]
                                 if gemm.tma_compatible(a, w) and n % 8 == 0 else [])
    for path in paths:
        out = gemm.matmul(a, w, bias=bias, split_k=split, **path)
        assert_close(out, ref, f"{m}x{n}x{k} split {split} {path}")


def _counters_zero() -> bool:
    return all(int(c.abs().sum()) == 0 for _, c in gemm._split_workspaces.values())


def test_split_k_repeated_and_back_to_back():
    """Split-K calls again and again on one shape (bitwise the same output: partials are
    summed in slice order), then other shapes and slice counts sharing the workspace; the
    arrival counters are 0 after every call (rearmed by the last slice, never memset)."""
    a, w = _inputs(40, 64, 160, torch.bfloat16, 11)
    first = gemm.matmul(a, w, split_k=3)
    assert_close(first, a.float() @ w.float().T, "split 3")
    assert _counters_zero()
    for _ in range(2):
        assert torch.equal(gemm.matmul(a, w, split_k=3), first)
        assert _counters_zero()
    for i, (m, n, k, split) in enumerate([(17, 32, 96, 2), (40, 64, 160, 5), (8, 16, 64, 2)]):
        a2, w2 = _inputs(m, n, k, torch.float16, 20 + i)
        out = torch.empty(m, n, dtype=torch.float16, device=DEVICE)
        assert gemm.matmul(a2, w2, out=out, split_k=split) is out
        assert_close(out, a2.float() @ w2.float().T, f"back-to-back {i}")
        assert _counters_zero()
    assert torch.equal(gemm.matmul(a, w, split_k=3), first)


def test_host_and_kernel_descriptors_agree():
    """Host-side TensorDescriptor arguments and in-kernel descriptors: the same sums in the
    same order, so the same bits; and both against torch, with and without split-K."""
    a, w = _inputs(48, 64, 96, torch.bfloat16, 13)
    for split in (1, 2):
        host = gemm.matmul(a, w, desc="host", split_k=split)
        kernel = gemm.matmul(a, w, desc="kernel", split_k=split)
        assert_close(host, a.float() @ w.float().T, f"host split {split}")
        assert torch.equal(host, kernel)
    _, args, kwargs = gemm.launch_args(a, w, None, host, tma=True, desc="host")
    assert kwargs["HOST_DESC"] and hasattr(args[0], "block_shape")
    _, args, kwargs = gemm.launch_args(a, w, None, host, tma=True, desc="kernel")
    assert not kwargs["HOST_DESC"] and isinstance(args[0], torch.Tensor)
    with pytest.raises(ValueError, match="desc must be"):
        gemm.matmul(a, w, desc="device")
    with pytest.raises(ValueError, match="split_k must be"):
        gemm.matmul(a, w, split_k=0)


def test_split_k_choice():
    """split_k_for: one slice without SPLIT_K or when the tiles fill the SMs; several for
    few tiles over deep K, never more work units than SMs (one wave), nor more than
    SPLIT_K or half the BK-steps. The fused ops' config (config_for without split_k) has
    no SPLIT_K."""
    cfg = gemm.CANDIDATES["64x128x64_s4_w4_sk8"]
    assert gemm.split_k_for(64, 3072, 4096, gemm.CANDIDATES["64x128x64_s4_w4"], 132) == 1
    assert gemm.split_k_for(8192, 8192, 4096, cfg, 132) == 1
    assert gemm.split_k_for(256, 3072, 4096, cfg, 132) == 1      # 96 tiles: no second unit
    assert gemm.split_k_for(64, 3072, 4096, cfg, 132) == 5       # 24 tiles, 5 a tile: 120
    deep = gemm.CANDIDATES["swab64x16x128_s6_w4_sk16"]
    for n, k in ((5120, 8192), (4096, 2048), (28672, 8192), (1024, 14336)):
        s = gemm.split_k_for(1, n, k, deep, 132)
        assert s == 1 or (s * -(-n // 64) <= 132 and s <= 16 and 2 * s <= k // 128), (n, k, s)
    assert gemm.split_k_for(64, 128, 256, cfg, 132) <= 2
    assert gemm.base_candidate("64x128x64_s4_w4_sk8") == "64x128x64_s4_w4"
    assert gemm.base_candidate("64x128x64_s4_w4") is None
    assert "SPLIT_K" not in gemm.config_for(64, 4096, 4096)
    assert "SPLIT_K" in gemm.config_for(64, 4096, 4096, split_k=True)


def test_tail_split_choice():
    """A TAIL config splits the last, partial wave's tiles only: at M=1024, N=5120 its
    320 tiles of 128x128 are 2 full waves of 132 and 56 more, which take 2 slices each
    (112 units: the most that fit one wave); none where the waves are full, or where the
    last is over half full (a second slice would not fit); under one wave it is split-K's
    choice, and a config without TAIL splits no launch of more tiles than SMs."""
    tail = gemm_configs.WS_CANDIDATES["ws128x128x64_s6_w8_tail4"]
    assert gemm.split_k_for(1024, 5120, 8192, tail, 132) == 2
    assert gemm.split_k_for(1024, 8448, 8192, tail, 132) == 1     # 8 x 66 = 528: 4 full waves
    assert gemm.split_k_for(1024, 14336, 4096, tail, 132) == 1    # 896: the last wave 104 tiles
    assert gemm.split_k_for(128, 4096, 4096, tail, 132) == 4      # 32 tiles: 4 slices, 128 units
    assert gemm.split_k_for(1, 256, 64, tail, 132) == 1           # one BK-step: no slice fits
    assert gemm.split_k_for(1, 256, 200, tail, 132) == 1          # 4 steps: the partials outweigh
    plain = dict(tail)
    del plain["TAIL"]
    assert gemm.split_k_for(128, 4096, 4096, plain, 132) == 4
    assert gemm.split_k_for(1024, 5120, 8192, plain, 132) == 1    # tiles > SMs: no split-K
    assert gemm.base_candidate("ws128x128x64_s6_w8_tail4") == "ws128x128x64_s6_w8"


# Every candidate of trident/ops/gemm_configs.py at its own tiles (one odd shape: partial
# tiles in M, N and K), and the stream-K ones also where stream_k_for shares tiles between
# programs (under the interpreter: 3 programs, K of 25 BK-steps of 64).
@pytest.mark.parametrize("name", list(gemm.KNOWN))
def test_candidates(name):
    cfg = gemm.KNOWN[name]
    shapes = [(70, 200, 136)] + ([(70, 200, 1544)] if cfg.get("STREAM_K") else [])
    for m, n, k in shapes:
        a, w = _inputs(m, n, k, torch.bfloat16, m + n + k)
        bias = torch.randn(n).to(torch.bfloat16).to(DEVICE)
        out = gemm.matmul(a, w, bias=bias, config=cfg)
        assert_close(out, a.float() @ w.float().T + bias.float(), f"{name} {m}x{n}x{k}")
    if cfg.get("STREAM_K") and DEVICE == "cpu":
        assert gemm.stream_k_for(m, n, k, cfg, gemm.INTERPRET_PROGRAMS) == 3
        assert _counters_zero()


# Stream-K at the interpreter's 16 x 32 x 32 tiles over its 3 programs: (M, N, K) of 4
# tiles (each program 1 1/3 of them), 7 tiles (3 data-parallel, then 4 shared), 1 tile
# (3 programs in one tile); K not a multiple of BK in two.
@pytest.mark.parametrize("m,n,k", [(32, 64, 200), (112, 24, 256), (9, 17, 800)])
def test_stream_k_values(m, n, k):
    cfg = dict(gemm.INTERPRET_CONFIG, STREAM_K=True)
    assert gemm.stream_k_for(m, n, k, cfg, gemm.INTERPRET_PROGRAMS) == 3
    a, w = _inputs(m, n, k, torch.float16, m * 5 + n + k)
    bias = torch.randn(n).to(torch.float16).to(DEVICE)
    ref = a.float() @ w.float().T + bias.float()
    paths = [dict(tma=False)] + ([dict(tma=True, desc="host"), dict(tma=True, desc="kernel")]
                                 if gemm.tma_compatible(a, w) and n % 8 == 0 else [])
    for path in paths:
        for swap in (False, True):
            out = gemm.matmul(a, w, bias=bias, config=dict(cfg, SWAP_AB=swap), **path)
            assert_close(out, ref, f"{m}x{n}x{k} stream-K {path} swap {swap}")
            assert _counters_zero()


def test_stream_k_repeated_and_choice():
    """Stream-K again and again: bitwise the same (partials summed in program order), the
    counters 0 after every call; stream_k_for: 0 without STREAM_K, for a full last wave and
    for too few BK-steps; base_candidate of a _streamk name; the fused ops' config has no
    STREAM_K."""
    cfg = dict(gemm.INTERPRET_CONFIG, STREAM_K=True)
    a, w = _inputs(32, 64, 200, torch.bfloat16, 17)
    first = gemm.matmul(a, w, config=cfg)
    assert_close(first, a.float() @ w.float().T, "stream-K")
    for _ in range(2):
        assert torch.equal(gemm.matmul(a, w, config=cfg), first)
        assert _counters_zero()
    # an explicit split_k runs split-K instead
    assert_close(gemm.matmul(a, w, config=cfg, split_k=2), a.float() @ w.float().T, "split")
    big = gemm.KNOWN["128x128x64_s4_w8_streamk"]
    assert gemm.stream_k_for(128, 14336, 4096, big, 132) == 132       # 112 tiles
    assert gemm.stream_k_for(128, 14336, 4096, gemm.CANDIDATES["128x128x64_s4_w8"], 132) == 0
    assert gemm.stream_k_for(128, 16896, 4096, big, 132) == 0         # 132 tiles: one wave
    assert gemm.stream_k_for(1024, 16384, 4096, big, 132) == 0        # 1024 tiles: 97% full
    assert gemm.stream_k_for(128, 512, 4096, big, 132) == 32          # 4 tiles, 8 steps each
    assert gemm.stream_k_for(128, 512, 512, big, 132) == 0            # 4 tiles of 8 steps
    assert gemm.stream_k_for(128, 512, 64, big, 132) == 0             # one step a tile
    assert gemm.stream_k_tiles(448, 132) == 264 and gemm.stream_k_tiles(112, 132) == 0
    assert gemm.base_candidate("128x128x64_s4_w8_streamk") == "128x128x64_s4_w8"
    assert gemm.base_candidate("256x128x64_s3_w8_streamk") == "256x128x64_s3_w8"
    assert "STREAM_K" not in gemm.config_for(128, 4096, 4096)
