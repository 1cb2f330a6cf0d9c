"""Every public op captured into a CUDA graph after an eager warm-up, replayed with new
inputs and checked against plain torch (each collective with each of its algorithms, the
three fused ops with each config family of their GEMM core -- classic, persistent TMA,
swap-AB, split-K, both, split-K with swap-AB on the classic core -- with each of their
other schedules ("sequential", "epilogue", "pipelined": capture_cases.SCHEDULES), and "auto" and
"plain", all_reduce_add_rmsnorm, MoE dispatch/combine); and every op through
torch.compile(mode="reduce-overhead"), whose CUDA graphs (cudagraph trees) capture on a
stream of their own, from a pool of their own, after one warm-up run -- the fused ops
once per config family (forced through the ops' options, which compiled graphs carry),
once as "auto" and once on the plain path, the MoE calls on both kernel paths. A buffer
that a call allocates during that warm-up and keeps (a plan's workspace, a launch's
scratch) is a block of the graphs' pool that no output accounts for: Inductor's check
raises "Detected N tensor(s) in the cudagraph pool not tracked as outputs" (as
examples/tp_decode.py did once the fused ops took the small-M configs).

The CUDA graphs need GPUs; on the CPU emulation the fused config families run through
torch.compile(backend="aot_eager") instead (the options reach the ops, values right);
tests/plans/test_capture_safety.py checks there what a capture forbids and
tests/ops/test_plan_retention.py what a call may leave allocated. The cases are in
capture_cases.py.

A capture that fails names no op (cudaErrorStreamCaptureInvalidated); each variant is
captured alone here so that a failure says which one."""
import pytest
import torch

from trident.ops import schedules

from ..conftest import BACKEND
from . import capture_cases as C

GPU = pytest.mark.skipif(BACKEND != "cuda",
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


@GPU
@pytest.mark.parametrize("name, variant", C.all_variants(),
                         ids=[f"{n}-{v}" for n, v in C.all_variants()])
def test_graph_capture(pool, name, variant):
    if variant in C.NCCL_VARIANTS and _shares_gpu(pool):
        pytest.skip("NCCL cannot run where ranks share a GPU")
    pool.run(_graph_replay, name, variant)


# torch.compile: one compiled function per family (a compile takes seconds): the
# algorithms the selector picks ("auto"), each fused op once per config family of its
# GEMM core (one op per graph, so that a failure names the op and the family), the fused
# ops on the plain path (NCCL + cuBLAS), MoE on both kernel paths
FUSED = ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce")
FAMILIES = {
    "collectives": [("all_reduce", "auto"), ("all_gather", "auto"),
                    ("reduce_scatter", "auto"), ("all_to_all", "auto"),
                    ("broadcast", "auto")],
    "fused": [("all_gather_matmul", "auto"), ("matmul_reduce_scatter", "auto"),
              ("matmul_all_reduce", "auto"), ("all_reduce_add_rmsnorm", "auto")],
    **{f"{op}-{fam}": [(op, f"fused/{fam}")] for op in FUSED for fam in C.FAMILIES},
    "fused-plain": [(op, "plain") for op in FUSED],
    **{f"fused_matmul-{name}": [(op, name) for op in FUSED if op in schedules.get(name).ops]
       for name in C.SCHEDULES},
    "moe": [("moe", "low_latency"), ("moe", "high_throughput")],
}


def _compiled(ctx, family, variants=None, calls=REPLAYS + 2, compile_options=None):
    """The family's cases (or `variants`) as one compiled function; on GPUs
    mode="reduce-overhead": warm-up, recording, then replays -- each call checked, no
    CUDA-graph skip allowed."""
    from torch._dynamo.utils import counters
    import torch._inductor.config as inductor_config
    # a tensor left alive in the graphs' pool then names the line that allocated it
    inductor_config.triton.cudagraph_trees_history_recording = True
    case = C.combined([C.make_case(ctx, n, v) for n, v in variants or FAMILIES[family]])
    # one rank process compiles every family in turn, each as case.fn (one code object):
    # without a reset the ninth family hits Dynamo's recompile limit (8) under fullgraph
    torch._dynamo.reset()
    compiled = torch.compile(case.fn, fullgraph=True,
                             **(compile_options or dict(mode="reduce-overhead")))
    skips = counters["inductor"]["cudagraph_skips"]
    for i in range(calls):
        torch.compiler.cudagraph_mark_step_begin()
        got = compiled(*case.inputs(i))
        ctx.sync()
        C.check(got, case.expected(i), f"compiled {family} rank {ctx.rank} call {i}")
        del got                            # a replay overwrites the previous outputs
        ctx.barrier()
    assert counters["inductor"]["cudagraph_skips"] == skips, \
        f"torch.compile ran {family} without CUDA graphs (its log says why)"
    case.close()


@GPU
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_compiled_reduce_overhead(pool, family):
    if family in ("fused-plain", "fused_matmul-async_tp") and _shares_gpu(pool):
        pytest.skip("NCCL cannot run where ranks share a GPU")
    pool.run(_compiled, family)


@pytest.mark.skipif(BACKEND == "cuda", reason="on GPUs the families run under "
                                              "reduce-overhead (test_compiled_reduce_overhead)")
def test_compiled_families_cpu(pool):
    """Every fused config family in one graph (one compile: they take long on the CPU),
    through Inductor's AOT pipeline without code generation: the options reach the ops
    and the values are right."""
    pool.run(_families_cpu)


def _families_cpu(ctx):
    from trident.ops._common import _options_key
    ctx.plans.clear()
    variants = [(op, f"fused/{fam}") for fam in C.FAMILIES for op in FUSED]
    _compiled(ctx, "fused config families", variants, 2, dict(backend="aot_eager"))
    # each op ran with each family's options (a plan's key holds its call's options)
    ran = {(key[0], key[6]) for key in ctx.plans._plans}
    missing = [(op, fam) for fam, opts in C.FAMILIES.items() for op in FUSED
               if (op, _options_key(opts)) not in ran]
    assert not missing, f"compiled calls without their family's options: {missing}"
