"""trident/triton_launch.py: the one module on Triton's internals. In CI (no GPU) this
fails loudly if an upgraded Triton changed what the fast launch relies on; on a GPU it
checks that the fast path is taken and launches exactly what kernel[grid](...) does."""
import pytest
import torch
import triton
import triton.language as tl

from trident import _env, triton_launch
from trident.triton_launch import Launch, Live, internals_problem

GPU = not _env.INTERPRET


@triton.jit
def _axpy(x, y, out, n, alpha, BLOCK: tl.constexpr, NEG: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = alpha * tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m)
    if NEG:
        v = -v
    tl.store(out + offs, v, mask=m)


def test_internals_are_what_the_fast_launch_expects():
    assert internals_problem() is None, (
        f"Triton {triton.__version__} changed what trident/triton_launch.py relies on: "
        f"{internals_problem()}. Update that module (launch plans fall back to the slow path).")


def _inputs(n=1000):
    dev = "cuda" if GPU else "cpu"
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, generator=g).to(dev), torch.randn(n, generator=g).to(dev),
            torch.empty(n, device=dev))


def test_launch_matches_ordinary_launch():
    x, y, out = _inputs()
    n = x.numel()
    launch = Launch(_axpy, (triton.cdiv(n, 256),), (x, y, Live(0), n, 2.0),
                    dict(BLOCK=256, NEG=True), tensors=(out,))
    assert (launch.fast is not None) == GPU, "GPUs take the fast path, the emulation does not"
    for _ in range(2):             # twice: the second call is the cached path
        fresh = torch.full_like(out, float("nan"))
        launch((fresh,))           # Live(0): the output is the call's tensor
        expected = torch.empty_like(out)
        _axpy[(triton.cdiv(n, 256),)](x, y, expected, n, 2.0, BLOCK=256, NEG=True)
        if GPU:
            torch.cuda.synchronize()
        assert torch.equal(fresh, expected)
    x.mul_(3)                      # contents change at the same address: read afresh
    launch((out,))
    if GPU:
        torch.cuda.synchronize()
    torch.testing.assert_close(out, -(2.0 * x + y))


@pytest.mark.skipif(not GPU, reason="launch hooks exist on GPUs only")
def test_launch_hooks_still_see_launches():
    from triton import knobs
    x, y, out = _inputs()
    launch = Launch(_axpy, (4,), (x, y, out, x.numel(), 1.0), dict(BLOCK=256, NEG=False))
    seen = []
    hook = seen.append
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        launch()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    torch.cuda.synchronize()
    assert len(seen) == 1
    torch.testing.assert_close(out, x + y)


def test_a_changed_triton_falls_back(monkeypatch):
    monkeypatch.setattr(triton_launch, "_problem", "simulated change")
    x, y, out = _inputs()
    launch = Launch(_axpy, (4,), (x, y, out, x.numel(), 1.0), dict(BLOCK=256, NEG=False))
    assert launch.fast is None
    launch()
    if GPU:
        torch.cuda.synchronize()
    torch.testing.assert_close(out, x + y)
