"""trident/runtime/triton_launch.py: the one module on Triton's internals. In CI (no GPU) this
fails loudly if an upgraded Triton changed what the fast launch relies on; on a GPU it
checks that the fast path is taken and launches exactly what kernel[grid](...) does."""
import pytest
import torch
import triton
import triton.language as tl

from trident.runtime import _env, triton_launch
from trident.runtime.triton_launch import Launch, Live, internals_problem

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
        f"Triton {triton.__version__} changed what trident/runtime/triton_launch.py relies on: "
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


class _FakeLauncher:
    """Stands in for a CudaLauncher of a kernel with global scratch (CPU test)."""
    num_ctas, global_scratch_size, global_scratch_align = 1, 96, 128

    def __init__(self):
        self.per_launch = []                  # CudaLauncher.__call__: scratch per launch

    def __call__(self, *args):
        self.per_launch.append(args)


class _FakeCompiled:
    def __init__(self):
        self.run, self.function, self.packed_metadata = _FakeLauncher(), "fn", "meta"


def _scratch_launch(stream_of, capturing):
    """A Launch on its fast path with global scratch, without a GPU: the C launcher
    records its arguments."""
    launch = object.__new__(Launch)
    calls = []
    launch.kernel, launch.grid, launch.live, launch.one_live = None, (3, 2, 1), [(1, 0)], None
    launch.direct, launch.compiled = False, _FakeCompiled()
    launch.fast = lambda *args: calls.append(args)
    launch.prefix = ("fn", 0, 0, None, None, "meta", None, None, None)
    launch.packed = (11, 0, 13)               # argument 1 is Live(0)
    launch.tail = launch.prefix + launch.packed
    launch.scratch, launch.device, launch.torch_device = {}, 0, torch.device("cpu")
    launch.stream, launch.capturing = stream_of, capturing

    class Hooks:
        class launch_enter_hook:
            calls = []
    launch.hooks = Hooks
    return launch, calls


def test_global_scratch_is_allocated_once_per_stream():
    """A kernel with global scratch (TMA descriptors) gets a buffer the Launch keeps, one
    per stream (launches on one stream run in order), of grid * num_ctas * size bytes,
    aligned; during a CUDA-graph capture Triton allocates per launch (the graph's pool
    outlives the plan)."""
    stream, capturing = [7], [False]
    launch, calls = _scratch_launch(lambda device: stream[0], lambda: capturing[0])
    t = torch.empty(4)
    for _ in range(3):
        launch((t,))
    assert len(calls) == 3
    scratch = {c[7] for c in calls}           # after grid (3), stream, function, coop, pdl
    assert len(scratch) == 1 and all(c[8] is None for c in calls), "one buffer, reused"
    ptr = scratch.pop()
    assert ptr % 128 == 0
    _, buf = launch.scratch[7]
    assert buf.numel() >= 6 * 96 and buf.data_ptr() <= ptr < buf.data_ptr() + 128
    assert calls[0][-3:] == (11, t.data_ptr(), 13), "the Live argument is read per call"
    stream[0] = 8                             # another stream: its own buffer
    launch((t,))
    assert calls[-1][7] != ptr and set(launch.scratch) == {7, 8}
    capturing[0] = True                       # capture: per launch, through CudaLauncher
    launch((t,))
    assert len(calls) == 4 and len(launch.compiled.run.per_launch) == 1
    assert launch.compiled.run.per_launch[0][:9] == (3, 2, 1, 8, "fn", "meta", None, None, None)


@pytest.mark.skipif(not GPU, reason="needs a GPU")
def test_global_scratch_kernel_matches_ordinary_launch():
    """A kernel with in-kernel TMA descriptors (global scratch) launched through a Launch:
    same result as kernel[grid](...), no allocation through Triton's allocator once warm,
    per-launch allocation inside a CUDA-graph capture, and the graph replays right."""
    from triton.runtime import _allocation

    @triton.jit
    def _tma_copy(x, out, n, BLOCK: tl.constexpr):
        src = tl.make_tensor_descriptor(x, shape=[n], strides=[1], block_shape=[BLOCK])
        dst = tl.make_tensor_descriptor(out, shape=[n], strides=[1], block_shape=[BLOCK])
        off = tl.program_id(0) * BLOCK
        dst.store([off], src.load([off]) * 2)

    asked = []

    def alloc(size, align, stream):
        asked.append(size)
        return torch.empty(size, dtype=torch.int8, device="cuda")
    triton.set_allocator(alloc)
    try:
        x = torch.randn(1024, device="cuda")
        out = torch.zeros_like(x)
        launch = Launch(_tma_copy, (4,), (x, Live(0), x.numel()), dict(BLOCK=256),
                        tensors=(out,))
        assert launch.scratch is not None, "the kernel should need global scratch"
        before = len(asked)
        for _ in range(3):
            out.zero_()
            launch((out,))
        torch.cuda.synchronize()
        assert len(asked) == before, "a warm launch allocates no scratch"
        torch.testing.assert_close(out, 2 * x)
        graph = torch.cuda.CUDAGraph()
        out.zero_()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.graph(graph, stream=side):
            launch((out,))
        assert len(asked) == before + 1, "inside a capture, scratch comes from the graph's pool"
        torch.cuda.current_stream().wait_stream(side)
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, 2 * x)
    finally:
        triton.set_allocator(_allocation._NULL_ALLOCATOR)


def test_launch_keeps_tensors_that_are_not_the_calls():
    """A launch keeps alive every tensor argument that is not (a view of) one of the
    call's own tensors: a split table or buffer made for the plan must not be freed while
    the plan launches with its address (the 2x H200 soak's all_to_all use-after-free)."""
    from trident.runtime.triton_launch import not_the_calls
    call_out, call_in = torch.zeros(8), torch.zeros(8)
    made_for_plan = torch.zeros(4, dtype=torch.int64)
    kept = not_the_calls([call_out.view(2, 4), call_in[2:], made_for_plan, 3, None],
                         (call_out, call_in))
    assert len(kept) == 1 and kept[0] is made_for_plan
