"""ctx.all_reduce_add_rmsnorm (trident/ccl/add_rmsnorm.py): the fused all-reduce + residual
add + RMSNorm against an independent torch reference (the sum of every rank's x, the add,
the norm), at odd hidden sizes, 1 and 0 rows, bf16/fp16/fp32, plain and heap tensors,
back-to-back calls mixed with all_reduce, debug mode, and its custom ops under
torch.compile(fullgraph=True). Results must be bit-identical on every rank."""
import pytest
import torch

from .refs import place, rank_inputs

# (dtype, x shape, x on the heap, residual on the heap, block, programs)
CASES = [
    (torch.bfloat16, (1, 37), False, False, None, None),
    (torch.float16, (5, 300), True, False, 64, None),
    (torch.bfloat16, (7, 1000), True, True, 256, 3),
    (torch.bfloat16, (0, 64), False, False, None, None),
    (torch.float16, (3, 2, 48), False, True, None, None),
    (torch.float32, (2, 33), True, False, 16, 1),
]


def reference(xs, residual, weight, eps):
    """The new residual and out, from every rank's x (plain torch, fp32)."""
    s = torch.stack([x.float() for x in xs]).sum(0)
    r = (residual.float() + s).to(residual.dtype)
    rf = r.float()
    out = rf / torch.sqrt((rf * rf).mean(-1, keepdim=True) + eps) * weight.float()
    return r, out.to(residual.dtype)


def close(got, expected, what):
    got, expected = got.cpu(), expected.cpu()
    # bf16: the interpreter rounds fp32 -> bf16 by truncation (one bf16 step), and out is
    # computed from that rounded residual
    tol = {torch.bfloat16: 3e-2, torch.float16: 3e-3, torch.float32: 1e-5}[got.dtype]
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol,
                               msg=lambda m: f"{what}: {m}")


def _inputs(ctx, i, dtype, shape, x_sym, r_sym, seed=0):
    xs = rank_inputs(ctx.world_size, shape, dtype, seed=10 * i + seed)
    g = torch.Generator().manual_seed(777 + i)
    residual = torch.randn(shape, generator=g).to(dtype)          # the same on every rank
    weight = (1 + 0.5 * torch.randn(shape[-1], generator=g)).to(dtype)
    return xs, residual, weight, place(ctx, xs[ctx.rank], x_sym), place(ctx, residual, r_sym)


def _cases(ctx, cases):
    results = []
    for i, (dtype, shape, x_sym, r_sym, block, programs) in enumerate(cases):
        what = f"{dtype} {shape} heap x={x_sym} residual={r_sym}"
        xs, residual, weight, x, res = _inputs(ctx, i, dtype, shape, x_sym, r_sym)
        w = weight.to(ctx.device)
        opts = dict(block=block, programs=programs)
        # twice back to back, an all_reduce in between (same epochs, scratch and flags)
        out1 = ctx.all_reduce_add_rmsnorm(x, res, w, 1e-6, **opts).clone()
        other = place(ctx, xs[ctx.rank][..., :5].reshape(-1).float(), False)
        ctx.all_reduce(other, algorithm="one_shot")
        out2 = torch.empty(shape, dtype=dtype, device=ctx.device)
        got = ctx.all_reduce_add_rmsnorm(x, res, w, 1e-6, out=out2, **opts)
        assert got is out2
        ctx.sync()
        r1, ref1 = reference(xs, residual, weight, 1e-6)
        r2, ref2 = reference(xs, r1, weight, 1e-6)
        close(out1, ref1, what + " (first call)")
        close(out2, ref2, what + " (second call)")
        close(res, r2, what + " residual")
        close(other, torch.stack([x[..., :5].reshape(-1).float() for x in xs]).sum(0),
              what + " all_reduce in between")
        results.append((out1.cpu().clone(), out2.cpu().clone(), res.cpu().clone()))
    return results


def test_add_rmsnorm(pool):
    per_rank = pool.run(_cases, CASES)
    for mine in per_rank[1:]:        # bit-identical on every rank
        for got, ref in zip(mine, per_rank[0]):
            for a, b in zip(got, ref):
                assert torch.equal(a, b)


def _algorithms_and_debug(ctx):
    dtype, shape = torch.bfloat16, (3, 40)
    algorithms = ("one_shot", "unfused") + ("nccl",) * ctx.nccl_available + ("auto",)
    for i, alg in enumerate(algorithms):
        xs, residual, weight, x, res = _inputs(ctx, i, dtype, shape, False, True, seed=5)
        out = ctx.all_reduce_add_rmsnorm(x, res, weight.to(ctx.device), 1e-5, algorithm=alg)
        r, ref = reference(xs, residual, weight, 1e-5)
        # the unfused paths round the sum to bf16 before the add
        ctx.sync()
        close(res, r, alg)
        close(out, ref, alg)
    ctx.debug = True
    try:
        xs, residual, weight, x, res = _inputs(ctx, 9, dtype, shape, True, False)
        out = ctx.all_reduce_add_rmsnorm(x, res, weight.to(ctx.device))
        r, ref = reference(xs, residual, weight, 1e-6)
        close(out, ref, "debug")
        if ctx.world_size == 1:     # one rank cannot differ from itself
            return
        with pytest.raises(ValueError, match="every rank must pass the same sizes"):
            y = torch.ones(1 + ctx.rank, 8, dtype=dtype, device=ctx.device)
            ctx.all_reduce_add_rmsnorm(y, y.clone(), torch.ones(8, dtype=dtype,
                                                                device=ctx.device))
    finally:
        ctx.debug = False


def test_algorithms_and_debug(pool):
    pool.run(_algorithms_and_debug)


def _bad_inputs(ctx):
    x = torch.ones(2, 8, dtype=torch.bfloat16, device=ctx.device)
    w = torch.ones(8, dtype=torch.bfloat16, device=ctx.device)
    with pytest.raises(ValueError, match="residual must have x's shape"):
        ctx.all_reduce_add_rmsnorm(x, torch.ones(2, 9, dtype=x.dtype, device=ctx.device), w)
    with pytest.raises(TypeError, match="residual must have x's dtype"):
        ctx.all_reduce_add_rmsnorm(x, x.half(), w)
    with pytest.raises(ValueError, match=r"weight must have shape \[8\]"):
        ctx.all_reduce_add_rmsnorm(x, x.clone(), w[:4])
    with pytest.raises(ValueError, match="contiguous"):
        ctx.all_reduce_add_rmsnorm(x, torch.ones(8, 2, dtype=x.dtype, device=ctx.device).t(), w)
    with pytest.raises(TypeError, match="bfloat16, float16 or float32"):
        ctx.all_reduce_add_rmsnorm(x.int(), x.int(), w)
    with pytest.raises(ValueError, match="unknown algorithm"):
        ctx.all_reduce_add_rmsnorm(x, x.clone(), w, algorithm="ring")


def test_bad_inputs(pool):
    pool.run(_bad_inputs)


def _compiled(ctx):
    from trident import torch_ops
    dtype, shape = torch.bfloat16, (2, 24)
    xs, residual, weight, x, _ = _inputs(ctx, 3, dtype, shape, False, False)
    w = weight.to(ctx.device)
    r1, ref1 = reference(xs, residual, weight, 1e-6)

    def eager_style(x, res):          # the eager call, unchanged, under torch.compile
        y = ctx.all_reduce_add_rmsnorm(x * 1, res, w)
        return y + 0

    res = residual.clone().to(ctx.device)
    out = torch.compile(eager_style, fullgraph=True, backend="aot_eager")(x, res)
    close(out, ref1, "compiled eager call")
    close(res, r1, "compiled eager call: residual updated in place")

    def functional(x, res):
        return torch_ops.all_reduce_add_rmsnorm(ctx, x, res, w)

    res0 = residual.clone().to(ctx.device)
    out, new_res = torch.compile(functional, fullgraph=True, backend="aot_eager")(x, res0)
    close(out, ref1, "compiled functional")
    close(new_res, r1, "compiled functional residual")
    assert torch.equal(res0.cpu(), residual), "the functional form must not touch residual"
    torch.library.opcheck(torch.ops.trident.all_reduce_add_rmsnorm_.default,
                          (x, residual.clone().to(ctx.device), w, 1e-6, ctx.name, None),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.trident.all_reduce_add_rmsnorm.default,
                          (x, residual.clone().to(ctx.device), w, 1e-6, ctx.name, None),
                          test_utils=("test_schema", "test_faketensor"))


def test_compiled(pool):
    pool.run(_compiled)
