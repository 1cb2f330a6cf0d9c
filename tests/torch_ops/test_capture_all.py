"""Every public op captured into a CUDA graph after an eager warm-up, replayed with new
inputs and checked against plain torch (each collective with each of its algorithms, the
three fused ops with both GEMM cores, all_reduce_add_rmsnorm, MoE dispatch/combine); and
every op through torch.compile(mode="reduce-overhead"), whose CUDA graphs (cudagraph
trees) capture on a stream of their own, from a pool of their own, after one warm-up run.
GPU only: the CPU emulation has no CUDA graphs (tests/plans/test_capture_safety.py checks
there what a capture forbids). The cases are in capture_cases.py.

A capture that fails names no op (cudaErrorStreamCaptureInvalidated); each variant is
captured alone here so that a failure says which one."""
import pytest
import torch

from ..conftest import BACKEND
from . import capture_cases as C

pytestmark = pytest.mark.skipif(BACKEND != "cuda",
                                reason="CUDA graphs need GPUs (the CPU emulation has none)")
REPLAYS = 3


def _shares_gpu(pool) -> bool:
    """Ranks share a GPU (more ranks than GPUs; placement is round-robin): no NCCL."""
    return pool.world_size > torch.cuda.device_count()


def _graph_replay(ctx, name, variant):
    case = C.make_case(ctx, name, variant)
    what = f"{name} {variant} rank {ctx.rank}"
    static = case.inputs(0)
    got = case.fn(*static)                 # warm-up: plans and workspaces are made here
    ctx.sync()
    C.check(got, case.expected(0), f"{what} eager")
    ctx.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = case.fn(*static)             # fresh outputs: plans are built during capture
    ctx.barrier()
    for i in range(1, REPLAYS + 1):
        for s, t in zip(static, case.inputs(i)):
            s.copy_(t)
        graph.replay()
        ctx.sync()
        C.check(got, case.expected(i), f"{what} replay {i}")
        ctx.barrier()                      # peers are done before the next inputs
    del graph, got
    case.close()


@pytest.mark.parametrize("name, variant", C.all_variants(),
                         ids=[f"{n}-{v}" for n, v in C.all_variants()])
def test_graph_capture(pool, name, variant):
    if variant in C.NCCL_VARIANTS and _shares_gpu(pool):
        pytest.skip("NCCL cannot run where ranks share a GPU")
    pool.run(_graph_replay, name, variant)


# torch.compile: one compiled function per family (a compile takes seconds), the
# algorithms the selector picks ("auto")
FAMILIES = {
    "collectives": [("all_reduce", "auto"), ("all_gather", "auto"),
                    ("reduce_scatter", "auto"), ("all_to_all", "auto"),
                    ("broadcast", "auto")],
    "fused": [("all_gather_matmul", "auto"), ("matmul_reduce_scatter", "auto"),
              ("matmul_all_reduce", "auto"), ("all_reduce_add_rmsnorm", "auto")],
    "moe": [("moe", "low_latency"), ("moe", "high_throughput")],
}


def _compiled(ctx, family):
    from torch._dynamo.utils import counters
    import torch._inductor.config as inductor_config
    # a tensor left alive in the graphs' pool then names the line that allocated it
    inductor_config.triton.cudagraph_trees_history_recording = True
    case = C.combined([C.make_case(ctx, n, v) for n, v in FAMILIES[family]])
    compiled = torch.compile(case.fn, mode="reduce-overhead", fullgraph=True)
    skips = counters["inductor"]["cudagraph_skips"]
    for i in range(REPLAYS + 2):           # warm-up, recording, then replays
        torch.compiler.cudagraph_mark_step_begin()
        got = compiled(*case.inputs(i))
        ctx.sync()
        C.check(got, case.expected(i), f"compiled {family} rank {ctx.rank} call {i}")
        del got                            # a replay overwrites the previous outputs
        ctx.barrier()
    assert counters["inductor"]["cudagraph_skips"] == skips, \
        f"torch.compile ran {family} without CUDA graphs (its log says why)"
    case.close()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_compiled_reduce_overhead(pool, family):
    pool.run(_compiled, family)
