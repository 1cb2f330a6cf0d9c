"""matmul_reduce_scatter and matmul_all_reduce against torch on the gathered inputs."""
import pytest
import torch

from .reference import assert_close, make, refused_without_nccl


def _check(ctx, op, m, n, k_local, dtype, with_bias, algorithm, calls=2):
    """Rank r holds columns [r*k_local, (r+1)*k_local) of A and of W (row-parallel)."""
    world, rank = ctx.world_size, ctx.rank
    for call in range(calls):                     # back to back, new data each call
        seed = 1000 * call + 31 * m + n + k_local
        a_full = make((m, k_local * world), seed, dtype, ctx.device)
        w_full = make((n, k_local * world), seed + 1, dtype, ctx.device)
        bias = make((n,), seed + 2, dtype, ctx.device) if with_bias else None
        cols = slice(rank * k_local, (rank + 1) * k_local)
        a, w = a_full[:, cols], w_full[:, cols].contiguous()
        ref = a_full.float() @ w_full.float().T + (bias.float() if with_bias else 0)
        fused_op = ctx.matmul_reduce_scatter if op == "reduce_scatter" else ctx.matmul_all_reduce
        if refused_without_nccl(ctx, algorithm, lambda: fused_op(a, w, algorithm=algorithm)):
            return
        if op == "reduce_scatter":
            out = ctx.matmul_reduce_scatter(a, w, bias=bias, algorithm=algorithm)
            ref = ref.chunk(world)[rank]
        else:
            out = ctx.matmul_all_reduce(a, w, bias=bias, algorithm=algorithm)
        ctx.sync()
        assert_close(out, ref, f"{op} rank {rank} call {call} {algorithm}")
        if op == "all_reduce":                    # one owner sums each tile: identical everywhere
            everyone = [torch.empty_like(out) for _ in range(world)]
            torch.distributed.all_gather(everyone, out.contiguous(), group=ctx.group)
            assert all(torch.equal(everyone[0], o) for o in everyone)


def _rows(world, m_per_rank):
    return m_per_rank * world


@pytest.mark.parametrize("m_per_rank,n,k_local", [(16, 48, 32), (17, 40, 24), (24, 80, 20)])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_reduce_scatter_fused(pool, m_per_rank, n, k_local, with_bias):
    pool.run(_check, "reduce_scatter", _rows(pool.world_size, m_per_rank), n, k_local,
             torch.bfloat16, with_bias, "fused")


@pytest.mark.parametrize("m,n,k_local", [(64, 48, 32), (66, 40, 24), (37, 80, 20)])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_all_reduce_fused(pool, m, n, k_local, with_bias):
    pool.run(_check, "all_reduce", m, n, k_local, torch.bfloat16, with_bias, "fused")


def test_fp16_plain_and_auto(pool):
    m = _rows(pool.world_size, 16)
    pool.run(_check, "reduce_scatter", m, 40, 24, torch.float16, True, "fused", 1)
    pool.run(_check, "all_reduce", m, 40, 24, torch.float16, True, "fused", 1)
    for op in ("reduce_scatter", "all_reduce"):
        pool.run(_check, op, m, 40, 24, torch.bfloat16, True, "plain", 1)
        pool.run(_check, op, m, 40, 24, torch.bfloat16, False, "auto", 1)


def _out_given(ctx):
    world, rank = ctx.world_size, ctx.rank
    m, n, k = 16 * world, 32, 24
    a_full = make((m, k * world), 5, torch.bfloat16, ctx.device)
    w_full = make((n, k * world), 6, torch.bfloat16, ctx.device)
    a, w = a_full[:, rank * k:(rank + 1) * k], w_full[:, rank * k:(rank + 1) * k]
    ref = a_full.float() @ w_full.float().T
    out = torch.full((m // world, n), float("nan"), dtype=torch.bfloat16, device=ctx.device)
    assert ctx.matmul_reduce_scatter(a, w, out=out, algorithm="fused") is out
    assert_close(out, ref.chunk(world)[rank], "reduce_scatter out=")
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=ctx.device)
    assert ctx.matmul_all_reduce(a, w, out=out, algorithm="fused") is out
    assert_close(out, ref, "all_reduce out=")


def test_out_given(pool):
    pool.run(_out_given)


def _bad_inputs(ctx):
    w = torch.randn(12, 16, dtype=torch.bfloat16, device=ctx.device)
    if ctx.world_size > 1:      # every row count is divisible by one
        with pytest.raises(ValueError, match="not divisible by the world size"):
            ctx.matmul_reduce_scatter(torch.randn(ctx.world_size * 4 + 1, 16, dtype=torch.bfloat16, device=ctx.device), w)
    a = torch.randn(ctx.world_size * 4, 16, dtype=torch.bfloat16, device=ctx.device)
    rows = a.shape[0] + (ctx.world_size == 1)    # all rows: right only at one rank
    with pytest.raises(ValueError, match="out must be"):
        ctx.matmul_reduce_scatter(a, w, out=torch.empty(rows, 12, dtype=torch.bfloat16, device=ctx.device))
    with pytest.raises(TypeError, match="must match"):
        ctx.matmul_all_reduce(a, w.half())
    with pytest.raises(ValueError, match="K differ"):
        ctx.matmul_all_reduce(a, torch.randn(12, 8, dtype=torch.bfloat16, device=ctx.device))
    with pytest.raises(ValueError, match="is on"):
        ctx.matmul_all_reduce(a, w, bias=torch.zeros(12, dtype=torch.bfloat16, device="meta"))


def test_bad_inputs(pool):
    pool.run(_bad_inputs)
