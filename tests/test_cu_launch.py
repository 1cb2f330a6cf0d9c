"""trident/runtime/cu_launch.py: a warm Launch's packed driver call. On the CPU, the packing
against the launcher's own rules (stand-ins for the compiled kernel and the driver); on a
GPU, that Launches take it and launch exactly what kernel[grid](...) does -- every scalar
type, a live pointer, PDL, an empty grid -- and that a refused driver call falls back to
Triton's launcher."""
import ctypes
import struct
import types

import pytest
import torch
import triton
import triton.language as tl

from trident.runtime import _env, cu_launch
from trident.runtime.triton_launch import Launch, Live

GPU = not _env.INTERPRET


def _fakes(signature: dict, num_ctas=1, scratch=0, pdl=1):
    compiled = types.SimpleNamespace(src=types.SimpleNamespace(signature=signature),
                                     packed_metadata=(4, num_ctas, 1024), function=1234)
    launcher = types.SimpleNamespace(launch_pdl=pdl, launch_cooperative_grid=0,
                                     global_scratch_size=scratch, profile_scratch_size=0)
    return compiled, launcher


def test_arguments_are_packed_as_the_launcher_packs_them(monkeypatch):
    calls = []
    monkeypatch.setattr(cu_launch, "_entry", lambda *a: calls.append(a) or 0)
    sig = {"p": "*fp32", "q": "*i8", "a": "i32", "b": "i64", "c": "fp32", "d": "bf16",
           "e": "fp16", "f": "i1", "BLOCK": "constexpr", "g": "u64"}
    compiled, launcher = _fakes(sig)
    d = cu_launch.build(compiled, launcher, (3, 2, 1),
                        (0x7F0000001000, None, -5, 1 << 40, 1.5, 1.5, -2.0, True, 256, 7),
                        live_pos=0)
    values = [s.value for s in d.storage]
    assert values == [0x7F0000001000, 0, -5, 1 << 40,
                      struct.unpack("<I", struct.pack("<f", 1.5))[0], 0x3FC0,
                      struct.unpack("<H", struct.pack("<e", -2.0))[0], 1, 7, 0, 0]
    assert [type(s) for s in d.storage[2:5]] == [ctypes.c_int32, ctypes.c_int64,
                                                ctypes.c_uint32]
    assert d.live is d.storage[0]
    c = d.config
    assert (c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.sharedMemBytes) == \
        (3, 2, 1, 128, 1024)
    assert c.numAttrs == 1 and d.attrs[0].id == cu_launch.PDL_ATTRIBUTE and d.attrs[0].value == 1
    d.live.value = 0xABC0
    assert d(0x55) == 0 and calls and d.config.hStream == 0x55
    assert ctypes.cast(d.params[0], ctypes.POINTER(ctypes.c_uint64)).contents.value == 0xABC0
    # an empty grid queues nothing, as the launcher does
    empty = cu_launch.build(compiled, launcher, (0, 1, 1), (1, 2, 3, 4, 1.0, 1.0, 1.0, 0, 8, 9))
    calls.clear()
    assert empty(0) == 0 and not calls


@pytest.mark.parametrize("change", ["tma", "clusters", "scratch", "tuple", "count", "value"])
def test_what_it_does_not_cover_keeps_tritons_launcher(monkeypatch, change):
    monkeypatch.setattr(cu_launch, "_entry", lambda *a: 0)
    sig, packed = {"p": "*fp32", "n": "i32"}, (4096, 3)
    kw = {}
    if change == "tma":
        sig["n"] = "nvTmaDesc"
    elif change == "clusters":
        kw["num_ctas"] = 2
    elif change == "scratch":
        kw["scratch"] = 64
    elif change == "tuple":
        sig["n"] = ("i32", "i32")
    elif change == "count":
        packed = (4096,)
    else:
        packed = (4096, "three")
    assert cu_launch.build(*_fakes(sig, **kw), (1, 1, 1), packed) is None


def test_no_driver_no_packed_path(monkeypatch):
    monkeypatch.setattr(cu_launch, "_entry", None)
    assert cu_launch.build(*_fakes({"p": "*fp32"}), (1, 1, 1), (4096,)) is None


@triton.jit
def _scalars(out, a, b, c, f, BIG: tl.constexpr):
    tl.store(out + 0, a.to(tl.float64))
    tl.store(out + 1, b.to(tl.float64))
    tl.store(out + 2, c.to(tl.float64))
    tl.store(out + 3, f.to(tl.float64) + BIG)


@triton.jit
def _axpy(x, y, out, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, alpha * tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


gpu_only = pytest.mark.skipif(not GPU, reason="the driver call needs a GPU")


@gpu_only
def test_scalars_reach_the_kernel_as_with_kernel_grid():
    out = torch.zeros(4, dtype=torch.float64, device="cuda")
    args = (out, -7, 3 << 33, 0.375, True)
    launch = Launch(_scalars, (1,), args, dict(BIG=100))
    assert launch.cu is not None, "a kernel of pointers and scalars takes the packed call"
    launch(())
    expected = torch.zeros_like(out)
    _scalars[(1,)](expected, *args[1:], BIG=100)
    torch.cuda.synchronize()
    assert torch.equal(out, expected) and out.tolist() == [-7.0, float(3 << 33), 0.375, 101.0]


@gpu_only
def test_a_live_pointer_is_read_per_call_and_pdl_is_kept():
    n = 1000
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, generator=g).cuda(), torch.randn(n, generator=g).cuda()
    launch = Launch(_axpy, (triton.cdiv(n, 128),), (x, y, Live(0), n, 0.5),
                    dict(BLOCK=128, launch_pdl=True), tensors=(torch.empty_like(x),))
    assert launch.cu is not None and launch.cu.live is not None
    assert launch.cu.config.numAttrs == 1 and launch.cu.attrs[0].id == cu_launch.PDL_ATTRIBUTE
    outs = [torch.full_like(x, float("nan")) for _ in range(3)]
    for o in outs:
        launch((o,))
    torch.cuda.synchronize()
    for o in outs:
        torch.testing.assert_close(o, 0.5 * x + y)


@gpu_only
def test_a_refused_driver_call_falls_back_to_tritons_launcher():
    n = 300
    x, y = torch.ones(n, device="cuda"), torch.ones(n, device="cuda")
    launch = Launch(_axpy, (3,), (x, y, Live(0), n, 2.0), dict(BLOCK=128),
                    tensors=(torch.empty_like(x),))
    assert launch.cu is not None
    launch.cu.entry = lambda *a: 201          # CUDA_ERROR_INVALID_CONTEXT, say
    out = torch.zeros_like(x)
    launch((out,))
    torch.cuda.synchronize()
    assert launch.cu is None and torch.equal(out, torch.full_like(x, 3.0))
