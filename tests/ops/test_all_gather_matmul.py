"""all_gather_matmul against torch on the gathered inputs (fp32 reference)."""
import pytest
import torch

import trident as td

from .reference import assert_close, make, refused_without_nccl


def _check(ctx, m_local, n, k, dtype, with_bias, algorithm, calls=2):
    world, rank = ctx.world_size, ctx.rank
    for call in range(calls):                     # back to back, new data each call
        seed = 1000 * call + 17 * m_local + n + k
        a_full = make((m_local * world, k), seed, dtype, ctx.device)
        w = make((n, k), seed + 1 + rank, dtype, ctx.device)
        bias = make((n,), seed + 99 + rank, dtype, ctx.device) if with_bias else None
        a = a_full[rank * m_local:(rank + 1) * m_local]
        if refused_without_nccl(ctx, algorithm, lambda: ctx.all_gather_matmul(a, w, algorithm=algorithm)):
            return
        out = ctx.all_gather_matmul(a, w, bias=bias, algorithm=algorithm)
        ctx.sync()
        ref = a_full.float() @ w.float().T + (bias.float() if with_bias else 0)
        assert_close(out, ref, f"rank {rank} call {call} {algorithm}")
    ctx.sync()


@pytest.mark.parametrize("m_local,n,k", [(32, 48, 64), (17, 33, 40), (33, 80, 72)])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_fused(pool, m_local, n, k, with_bias):
    pool.run(_check, m_local, n, k, torch.bfloat16, with_bias, "fused")


def test_fused_fp16_and_plain(pool):
    pool.run(_check, 24, 40, 48, torch.float16, True, "fused", 1)
    pool.run(_check, 24, 40, 48, torch.bfloat16, True, "nccl", 1)   # = "plain"
    pool.run(_check, 24, 40, 48, torch.bfloat16, False, "auto", 1)


def _out_and_interleaved(ctx):
    """out= is written in place; two shapes sharing a workspace alternate safely."""
    rank, world = ctx.rank, ctx.world_size
    for call, (m_local, n, k) in enumerate([(16, 32, 32), (20, 24, 40), (16, 32, 32)]):
        a_full = make((m_local * world, k), 7 + call, torch.bfloat16, ctx.device)
        w = make((n, k), 70 + call + rank, torch.bfloat16, ctx.device)
        out = torch.full((m_local * world, n), float("nan"), dtype=torch.bfloat16, device=ctx.device)
        got = ctx.all_gather_matmul(a_full[rank * m_local:(rank + 1) * m_local], w, out=out,
                                    algorithm="fused")
        assert got is out
        assert_close(out, a_full.float() @ w.float().T, f"call {call}")


def test_out_and_interleaved_shapes(pool):
    pool.run(_out_and_interleaved)


def _bad_inputs(ctx):
    a = torch.randn(8, 16, dtype=torch.bfloat16, device=ctx.device)
    w = torch.randn(12, 16, dtype=torch.bfloat16, device=ctx.device)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        ctx.all_gather_matmul(a.float(), w.float())
    with pytest.raises(TypeError, match="must match"):
        ctx.all_gather_matmul(a, w.half())
    with pytest.raises(ValueError, match="K differ"):
        ctx.all_gather_matmul(a, torch.randn(12, 15, dtype=torch.bfloat16, device=ctx.device))
    with pytest.raises(ValueError, match="2-D"):
        ctx.all_gather_matmul(a[0], w)
    with pytest.raises(ValueError, match=r"bias must have shape \[12\]"):
        ctx.all_gather_matmul(a, w, bias=torch.zeros(5, dtype=torch.bfloat16, device=ctx.device))
    rows = 8 if ctx.world_size > 1 else 9       # the local rows: right only at one rank
    with pytest.raises(ValueError, match="out must be"):
        ctx.all_gather_matmul(a, w, out=torch.empty(rows, 12, dtype=torch.bfloat16, device=ctx.device))
    with pytest.raises(ValueError, match="algorithm"):
        ctx.all_gather_matmul(a, w, algorithm="fast")
    with pytest.raises(TypeError, match="torch.Tensor"):
        ctx.all_gather_matmul([[1.0]], w)


def test_bad_inputs(pool):
    pool.run(_bad_inputs)


def _mismatched_ranks(ctx):
    """In debug mode the sizes are compared across ranks before anything is launched."""
    m_local = 8 + ctx.rank
    a = torch.randn(m_local, 16, dtype=torch.bfloat16, device=ctx.device)
    w = torch.randn(12, 16, dtype=torch.bfloat16, device=ctx.device)
    with td.init(heap_size=1 << 20, group=ctx.group, debug=True) as dbg:
        with pytest.raises(ValueError, match="every rank must pass the same sizes"):
            dbg.all_gather_matmul(a, w)


def test_sizes_must_agree_across_ranks(pool):
    if pool.world_size == 1:
        pytest.skip("needs two ranks: one rank cannot disagree with itself")
    pool.run(_mismatched_ranks)


def _cores(ctx, gemm):
    """The fused schedule on one GEMM core against torch, at shapes whose M is no multiple
    of the tile (blocks straddle ranks) and whose N is an odd multiple of 8; K a multiple
    of 8 (TMA, the gluon core's need) but not of BK, and one K that is not (every core
    then runs the "tma" one's pointer path). Larger on GPUs: several row blocks and
    column blocks per rank, and a split-K case at small M."""
    rank, world = ctx.rank, ctx.world_size
    gpu = ctx.backend == "cuda"
    shapes = [(150, 264, 200, None), (13, 40, 48, None), (64, 136, 520, 3),
              (256, 200, 256, None), (96, 72, 36, None)] if gpu else \
        [(13, 40, 48, None), (9, 24, 36, None)]
    for call, (m_local, n, k, split_k) in enumerate(shapes):
        a_full = make((m_local * world, k), 50 + call, torch.bfloat16, ctx.device)
        w = make((n, k), 60 + call + rank, torch.bfloat16, ctx.device)
        bias = make((n,), 70 + call + rank, torch.bfloat16, ctx.device) if call % 2 else None
        a = a_full[rank * m_local:(rank + 1) * m_local]
        options = {} if split_k is None else {"split_k": split_k}
        for repeat in range(2):                 # the second call reuses plan and flags
            out = ctx.all_gather_matmul(a, w, bias, algorithm="fused", gemm=gemm, **options)
            ref = a_full.float() @ w.float().T + (bias.float() if bias is not None else 0)
            assert_close(out, ref, f"rank {rank} {gemm} {(m_local, n, k)} call {repeat}")
    ctx.sync()


@pytest.mark.parametrize("gemm", ["tma", "gluon"])
def test_fused_cores_odd_shapes(pool, gemm):
    """gemm="gluon": fused_gluon.py's kernel on sm_90 GPUs; on the CPU emulation (and at
    K % 8 != 0) its fallback, the "tma" core."""
    pool.run(_cores, gemm)
