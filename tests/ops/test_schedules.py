"""Every schedule of the three fused ops (trident/ops/schedules.py) against fp32 torch on the
gathered inputs, and schedule= itself: names, the algorithm= alias, errors, auto's choice
the same on every rank.

One pool.run per world size does every check (starting a world's ranks is the cost here).
"""
import pytest
import torch

from trident.ops import auto, schedules

from ..conftest import BACKEND
from .reference import assert_close, make

OPS = schedules.OPS
# (M: rows per rank -- of a for all_gather_matmul, of out for matmul_reduce_scatter --,
# N, K per rank): M = 1, and odd sizes (M and N not multiples of the CPU tile 16x32, K not
# a multiple of BLOCK_K 32)
SHAPES = ((1, 33, 40), (7, 40, 24))


def _runnable(ctx, op):
    """The schedules that can run here: registered ones, "plain" only where NCCL can,
    "async_tp" only on GPUs of their own (schedules.unavailable)."""
    return [n for n in schedules.registered(op) if schedules.unavailable(ctx, op, n) is None]


def _case(ctx, op, name, M, N, K, with_bias, out_given, seed, **opts):
    world, rank = ctx.world_size, ctx.rank
    rows = M if op != "matmul_reduce_scatter" else M * world
    if op == "all_gather_matmul":
        a_full = make((rows * world, K), seed, torch.bfloat16, ctx.device)
        w = make((N, K), seed + 1 + rank, torch.bfloat16, ctx.device)    # each rank's own
        a = a_full[rank * rows:(rank + 1) * rows]
        ref = a_full.float() @ w.float().T
    else:
        a_full = make((rows, K * world), seed, torch.bfloat16, ctx.device)
        w_full = make((N, K * world), seed + 1, torch.bfloat16, ctx.device)
        cols = slice(rank * K, (rank + 1) * K)
        a, w = a_full[:, cols], w_full[:, cols].contiguous()
        ref = a_full.float() @ w_full.float().T
    bias = make((N,), seed + 9, torch.float32 if seed % 2 else torch.bfloat16,
                ctx.device) if with_bias else None
    if bias is not None:
        ref = ref + bias.float()
    if op == "matmul_reduce_scatter":
        ref = ref.chunk(world)[rank]
    out = torch.full(tuple(ref.shape), float("nan"), dtype=torch.bfloat16,
                     device=ctx.device) if out_given else None
    got = getattr(ctx, op)(a, w, bias, out=out, schedule=name, **opts)
    if out_given:
        assert got is out
    ctx.sync()
    what = f"{op} {name} {opts} M={M} N={N} K={K} bias={with_bias} out={out_given} rank {rank}"
    assert_close(got, ref, what)
    if op == "matmul_all_reduce" and name != "plain":   # rank order: identical everywhere
        everyone = [torch.empty_like(got) for _ in range(world)]
        torch.distributed.all_gather(everyone, got.contiguous(), group=ctx.group)
        assert all(torch.equal(everyone[0], o) for o in everyone), what + ": ranks differ"


def _every_schedule(ctx):
    ran = []
    for op in OPS:
        variants = [(name, {}) for name in _runnable(ctx, op)]
        if op != "all_gather_matmul":          # the row-parallel ops' other exchange
            variants.append(("epilogue", {"exchange": "lamport"}))
        for name, opts in variants:
            for i, (M, N, K) in enumerate(SHAPES):
                # twice per signature (a warm call runs the plan), bias and out= alternating
                for call in range(2):
                    _case(ctx, op, name, M, N, K, (i + call) % 2 == 1, call == 1,
                          seed=100 * i + 10 * call + len(name), **opts)
            ran.append((op, name))
    return ran


def test_every_schedule_against_torch(pool):
    ran = pool.run(_every_schedule)[0]
    assert {name for _, name in ran} >= {"fused", "sequential"}


def _names_and_errors(ctx):
    a = torch.randn(4, 16, dtype=torch.bfloat16, device=ctx.device)
    w = torch.randn(8, 16, dtype=torch.bfloat16, device=ctx.device)
    with pytest.raises(ValueError, match="unknown schedule 'fast'.*sequential"):
        ctx.matmul_all_reduce(a, w, schedule="fast")
    with pytest.raises(ValueError, match="unknown algorithm"):
        ctx.matmul_all_reduce(a, w, algorithm="fast")
    with pytest.raises(ValueError, match="disagree"):
        ctx.matmul_all_reduce(a, w, schedule="fused", algorithm="sequential")
    with pytest.raises(TypeError, match="takes the options"):
        ctx.matmul_all_reduce(a, w, schedule="sequential", split_k=2)
    if "pipelined" not in schedules.registered():
        with pytest.raises(NotImplementedError, match="pipelined"):
            ctx.all_gather_matmul(a, w, schedule="pipelined")
    # the older keyword and the alias still work, and name the same plan's schedule
    ref = ctx.matmul_all_reduce(a, w, schedule="fused")
    assert torch.equal(ctx.matmul_all_reduce(a, w, algorithm="fused"), ref)
    if ctx.nccl_available:
        assert_close(ctx.matmul_all_reduce(a, w, algorithm="nccl"), ref.float(), "nccl alias")


def test_names_and_errors(pool):
    pool.run(_names_and_errors)


def _choices(ctx):
    """auto's choice for a grid of shapes: from sizes all ranks share only."""
    return [auto.choose(ctx, op, M, S, S, graph) for op in OPS for graph in (False, True)
            for M in (1, 8, 64, 512, 4096) for S in (1024, 8192, 32768)]


def test_auto_decides_alike_on_every_rank(pool):
    got = pool.run(_choices)
    assert all(g == got[0] for g in got)
    mine = {n for n, s in schedules.registered().items() if not s.needs_nccl}
    assert set(got[0]) <= (mine if BACKEND == "cpu" else set(schedules.registered()))
    assert "async_tp" not in got[0] or BACKEND == "cuda"


def test_auto_uses_only_the_shared_size():
    """all_gather_matmul's N and the row-parallel ops' K are each rank's own: auto must
    choose the same whatever they are."""
    from types import SimpleNamespace
    ctx = SimpleNamespace(backend="cpu", world_size=4, capturing=lambda: False)
    for M in (1, 16, 300, 5000):
        assert len({auto.choose(ctx, "all_gather_matmul", M, n, 4096) for n in (8, 4096, 30000)}) == 1
        for op in ("matmul_all_reduce", "matmul_reduce_scatter"):
            assert len({auto.choose(ctx, op, M, 4096, k) for k in (0, 8, 4096, 30000)}) == 1


def _gather_rows_anywhere(ctx):
    """epilogue's all_gather_matmul reads the peers' rows where they lie: a on the heap at
    a different offset on each rank (used in place), not contiguous (staged), split-K."""
    world, rank = ctx.world_size, ctx.rank
    M, N, K = 5, 40, 72
    a_full = make((M * world, K), 7, torch.bfloat16, ctx.device)
    w = make((N, K), 8 + rank, torch.bfloat16, ctx.device)
    ref = a_full.float() @ w.float().T
    mine = a_full[rank * M:(rank + 1) * M]
    heap = ctx.zeros(M + world, K, dtype=torch.bfloat16)        # the same size everywhere
    on_heap = heap[rank:rank + M]
    on_heap.copy_(mine)
    strided = torch.zeros(M, 2 * K, dtype=torch.bfloat16, device=ctx.device)[:, K:]
    strided.copy_(mine)
    for what, a, opts in (("heap", on_heap, {}), ("strided", strided, {}),
                          ("split", mine, {"split_k": 3})):
        got = ctx.all_gather_matmul(a, w, schedule="epilogue", **opts)
        ctx.sync()
        assert_close(got, ref, f"epilogue all_gather_matmul {what} rank {rank}")
    ctx.free(heap)


def test_epilogue_gathers_rows_wherever_they_lie(pool):
    pool.run(_gather_rows_anywhere)
