"""A graph that torch.compile made at one world size is not reused at another.

Inductor keeps compiled graphs on disk (FX graph and AOTAutograd caches, shared by every
process of the user) under a key made of the graph's code and its inputs' shapes; a hit
reuses the output shapes the custom ops' fakes gave when it was made. The names the ops
carry (ctx.name, ep.name) must therefore differ where those shapes differ: here the
all_gather_matmul rows (world * rows) and the MoE capacity (max_num_tokens * world), with
inputs of the same shapes at every world size. Before the names carried the world size,
the second job hit the first one's graph and Inductor's assert_size_stride failed
("expected size 64==32 ... incorrect fake"), as on the one-GPU run at worlds 1 and 2.
"""
import torch

from ..conftest import get_pool
from ..ops.reference import make
from . import capture_cases as C

ROWS, OUT, K = 2, 16, 32           # all_gather_matmul: rows per rank (any world), W [OUT, K]


def _gather_matmul_case(ctx) -> C.Case:
    """all_gather_matmul with ROWS rows per rank whatever the world (same input shapes in
    every job), W and bias the same on every rank."""
    bf, world = torch.bfloat16, ctx.world_size
    a = lambda i, p: make((ROWS, K), 1000 + 16 * i + p, bf, ctx.device)  # noqa: E731
    wb = lambda i: (make((OUT, K), 1100 + i, bf, ctx.device),  # noqa: E731
                    make((OUT,), 1200 + i, bf, ctx.device))

    def expected(i):
        full = torch.cat([a(i, p) for p in range(world)]).float()
        w, b = wb(i)
        return (full @ w.float().T + b.float(),)
    return C.Case(lambda i: (a(i, ctx.rank), *wb(i)),
                  lambda x, w, b: (ctx.all_gather_matmul(x, w, b),), expected)


def _cache_hits() -> int:
    from torch._dynamo.utils import counters
    return counters["inductor"]["fxgraph_cache_hit"] + \
        counters["aot_autograd"]["autograd_cache_hit"]


def _compile_and_check(ctx, cache_dir: str, runs: int) -> list[int]:
    """Compile (Inductor, on-disk caches in cache_dir) and check each case, a graph of its
    own, `runs` times, each after forgetting what Dynamo compiled in this process; the cache
    hits of each run. The all_gather_matmul graph carries only ctx.name (the same in every
    job before it carried the world), the MoE one also ep.name (its number counts the
    objects made in the process: it matched the other job's in the first test only)."""
    from torch._inductor import config
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
    cases = [_gather_matmul_case(ctx),
             C.moe(ctx, "low_latency", tokens=4, hidden=32, max_num_tokens=4, scale=1)]
    hits = [0] * runs
    try:
        with temporary_cache_dir(cache_dir), config.patch(fx_graph_cache=True):
            for run in range(runs):
                torch._dynamo.reset()
                for j, case in enumerate(cases):
                    before = _cache_hits()
                    got = torch.compile(case.fn, fullgraph=True)(*case.inputs(run))
                    ctx.sync()
                    C.check(got, case.expected(run), f"world {ctx.world_size} rank "
                                                     f"{ctx.rank} case {j} run {run}")
                    hits[run] += _cache_hits() - before > 0
                    ctx.barrier()
    finally:
        for case in cases:
            case.close()
    return hits


def test_compiled_graph_not_reused_across_worlds(pool, tmp_path):
    """Another world's job compiles first (twice: the second run must hit the cache, so the
    cache is live), then this pool's job compiles the same function into the same cache."""
    other = get_pool(1 if pool.world_size != 1 else 2)
    cache = str(tmp_path)
    for hits in other.run(_compile_and_check, cache, 2):
        # (the first run may find a graph its peer rank wrote: they share the cache)
        assert hits[1] == 2, f"graphs found in the on-disk cache per run: {hits}; the " \
                             f"second run should have found both"
    pool.run(_compile_and_check, cache, 1)
