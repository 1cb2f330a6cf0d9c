"""The warp-specialised Gluon GEMM (trident/ops/gemm_ws.py) against torch on random data:
every WS candidate at odd shapes (M, N and K tails, one row, more tiles than programs),
bias, out=, fp16, a CUDA-graph replay of a fresh output, split-K (uneven slices,
deterministic, counters rearmed), the TAIL configs' split of the last wave only; and where it cannot run (the CPU emulation, tensors TMA
cannot take) a GLUON config runs its TWIN, with the same values. Runs in this process
(no ranks)."""
import pytest
import torch

from trident.ops import gemm, gemm_configs

from .reference import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_HOPPER = DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0)
WS = gemm_configs.WS_CANDIDATES


def _inputs(m, n, k, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype).to(DEVICE)
    return a, w


def _kernel_of(a, w, cfg, **kw):
    out = torch.empty(a.shape[0], w.shape[0], dtype=a.dtype, device=a.device)
    return gemm._launch_of(a, w, None, out, cfg, kw.get("tma"), kw.get("desc"),
                           kw.get("split_k"))[0]


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel runs on sm_90 GPUs only")
@pytest.mark.parametrize("name", sorted(WS))
@pytest.mark.parametrize("m,n,k", [(1, 256, 64), (77, 136, 200), (300, 520, 1000),
                                   (1024, 2048, 512)])
def test_values(name, m, n, k):
    a, w = _inputs(m, n, k, seed=m + n + k)
    assert _kernel_of(a, w, WS[name]) is not gemm._gemm_kernel
    assert_close(gemm.matmul(a, w, config=WS[name]), a.float() @ w.float().T,
                 f"{name} {m}x{n}x{k}")


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel runs on sm_90 GPUs only")
def test_bias_out_fp16_and_graph_replay():
    cfg = WS["ws128x128x64_s6_w8"]
    a, w = _inputs(200, 392, 264, torch.float16, 7)
    bias = torch.randn(392, device=DEVICE, dtype=torch.float16)
    ref = a.float() @ w.float().T + bias.float()
    out = torch.full((200, 392), float("nan"), dtype=torch.float16, device=DEVICE)
    assert gemm.matmul(a, w, bias, out=out, config=cfg) is out
    assert_close(out, ref, "bias, out=, fp16")
    graph = torch.cuda.CUDAGraph()
    gemm.matmul(a, w, bias, config=cfg)                      # the plan exists before capture
    with torch.cuda.graph(graph):
        fresh = gemm.matmul(a, w, bias, config=cfg)
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(fresh, a.float() @ w.float().T + bias.float(), "graph replay")


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel runs on sm_90 GPUs only")
@pytest.mark.parametrize("name", ["ws128x128x64_s6_w8_sk4", "ws64x64x128_s6_w4"])
@pytest.mark.parametrize("split", [2, 3, 5])
def test_split_k_deterministic_and_rearmed(name, split):
    """Forced K slices (uneven: K steps not a multiple of split), twice: the same bits
    (slices summed in order), and the arrival counters back at 0 after every launch."""
    a, w = _inputs(130, 200, 1000, seed=split)
    assert _kernel_of(a, w, WS[name], split_k=split) is not gemm._gemm_kernel
    first = gemm.matmul(a, w, config=WS[name], split_k=split)
    assert_close(first, a.float() @ w.float().T, f"{name} split_k={split}")
    assert torch.equal(first, gemm.matmul(a, w, config=WS[name], split_k=split))
    torch.cuda.synchronize()
    assert all(int(c.abs().sum()) == 0 for _, c in gemm._split_workspaces.values())


TAIL = sorted(name for name, cfg in WS.items() if cfg.get("TAIL"))


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel runs on sm_90 GPUs only")
@pytest.mark.parametrize("name", TAIL)
@pytest.mark.parametrize("split", [None, 3])
def test_tail_split_values_deterministic_and_rearmed(name, split):
    """A TAIL config on a shape of one full wave of tiles and a part of another (this
    GPU's SMs + 1/4 of them, M, N and K not multiples of the tile, N and K multiples of 8
    so that TMA takes the tensors): the full wave whole, the
    rest in K slices (split_k_for's choice, or 3 forced), right values, the same bits
    twice, the counters back at 0."""
    cfg = WS[name]
    sms = gemm.num_sms(torch.device(DEVICE))       # the rank's share under MPS: 14 at 11 %
    rows = 2                                       # tiles: sms + sms // 4 (+ 1), any sms
    cols = -(-(sms + max(sms // 4, 1)) // rows)
    m, n, k = rows * cfg["BM"] - 5, cols * cfg["BN"] - 8, 40 * cfg["BK"] + 8
    tiles = rows * cols
    assert sms < tiles and tiles % sms <= sms // 2
    if split is None:
        assert gemm.split_k_for(m, n, k, cfg, sms) > 1
    a, w = _inputs(m, n, k, seed=len(name))
    assert _kernel_of(a, w, cfg, split_k=split) is not gemm._gemm_kernel
    first = gemm.matmul(a, w, config=cfg, split_k=split)
    assert_close(first, a.float() @ w.float().T, f"{name} {m}x{n}x{k} split_k={split}")
    assert torch.equal(first, gemm.matmul(a, w, config=cfg, split_k=split))
    torch.cuda.synchronize()
    assert all(int(c.abs().sum()) == 0 for _, c in gemm._split_workspaces.values())


@pytest.mark.parametrize("name", ["ws128x128x64_s6_w8", "ws64x64x128_s6_w4_sk8"])
def test_twin_where_gluon_cannot_run(name):
    cfg = WS[name]
    a, w = _inputs(40, 72, 48, seed=3)
    ref = a.float() @ w.float().T
    if not ON_HOPPER:               # CPU emulation, or a GPU other than sm_90
        assert _kernel_of(a, w, cfg) is gemm._gemm_kernel
        assert _kernel_of(a, w, cfg, split_k=2) is gemm._gemm_kernel
    assert_close(gemm.matmul(a, w, config=cfg), ref, f"{name}")
    assert_close(gemm.matmul(a, w, config=cfg, split_k=2), ref, f"{name} split_k=2")
    odd = torch.randn(40, 49, device=DEVICE).to(torch.bfloat16)[:, 1:]   # row stride 49
    assert _kernel_of(odd, w, cfg) is gemm._gemm_kernel
    assert_close(gemm.matmul(odd, w, config=cfg), odd.float() @ w.float().T,
                 f"{name} odd stride")


def test_ws_configs_name_a_twin_and_stay_out_of_fused_kernels():
    """Every WS candidate names a twin of gemm.py's kernel, and the fused kernels'
    config of a table entry that names one is that twin (their shared memory is checked
    where they compile: tests/compile/sm90.py)."""
    for name, cfg in WS.items():
        twin = gemm.resolve(cfg["TWIN"])
        assert not twin.get("GLUON") and not twin.get("SWAP_AB"), name


def test_fused_kernels_take_a_gluon_entrys_twin(monkeypatch):
    """A table entry that names a Gluon config gives the fused kernels its TWIN (they are
    gemm.py's kernel: fused_tile.fused_gemm_config)."""
    from types import SimpleNamespace

    from trident.ops import fused_tile
    name = "ws128x128x64_s6_w8"
    monkeypatch.setattr(gemm, "config_for", lambda *a, **k: gemm.resolve(name))
    ctx = SimpleNamespace(options=SimpleNamespace(gemm="tma"))
    cfg = fused_tile.fused_gemm_config(ctx, 256, 4096, 4096, None, None, 8, "K")
    twin = gemm.resolve(WS[name]["TWIN"])
    assert "GLUON" not in cfg and "TWIN" not in cfg
    assert (cfg["BM"], cfg["BN"], cfg["BK"], cfg["num_stages"]) == \
        (twin["BM"], twin["BN"], twin["BK"], twin["num_stages"])
