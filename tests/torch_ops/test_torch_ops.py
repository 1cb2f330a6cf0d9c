"""trident's torch custom ops (trident/torch/ops/) on the CPU emulation: the eager calls
inside torch.compile(fullgraph=True), a tensor-parallel MLP compiled vs eager, gradients
against a single-process reference, and torch.library.opcheck of every op.

torch.compile uses backend="aot_eager" here: inductor works too (g++ is there), but its
C++ compiles would take minutes of the 2-core CI budget; aot_eager runs the same Dynamo
capture, functionalization of the in-place ops, fake tensors and AOT autograd. Each test
compiles its functions once per rank and reuses them.
"""
import torch
import torch.nn.functional as F

from trident.api.context_ops import UNBOUND, OpMethods
from trident.torch import ops as T

T_ROWS, HID, FFN = 12, 32, 24          # divisible by world sizes 2, 3 and 4
BACKEND = "aot_eager"
DEVICE = ["cpu"]                       # this rank's device, set by each check (GPU runs)


def _full(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(DEVICE[0])


def _close(got, want, what, tol=1e-5):
    got, want = got.float(), want.float()
    scale = max(want.abs().max().item(), 1.0)
    err = (got - want).abs().max().item()
    assert got.shape == want.shape and err <= tol * scale, \
        f"{what}: max error {err:.3g} (scale {scale:.3g}), shapes {list(got.shape)} {list(want.shape)}"


# ---------------------------------------------------------------------------- eager calls
def _eager_calls(ctx, x, a, w, wk):
    """The calls users make eagerly, unchanged; run eagerly and compiled."""
    world = ctx.world_size
    t = x * 2
    ctx.all_reduce(t)
    g = x.new_empty(world * x.shape[0], x.shape[1])
    ctx.all_gather(g, x)
    rs = x.new_empty(x.shape[0] // world, x.shape[1])
    ctx.reduce_scatter(rs, x + 1)
    a2a = torch.empty_like(x)
    ctx.all_to_all(a2a, x - 1)
    b = x.clone()
    ctx.broadcast(b, src=world - 1)
    y1 = ctx.all_gather_matmul(a, wk)
    y2 = ctx.matmul_reduce_scatter(a, w)
    y3 = ctx.matmul_all_reduce(a, w)
    residual = (y3 * 0.5).contiguous()          # the same on every rank
    y4, res4 = ctx.matmul_all_reduce_add_rmsnorm(a, w, residual, residual[0].abs() + 0.5)
    return t + 1, g, rs, a2a, b, y1, y2, y3, y4, res4


def _check_eager_calls(ctx):
    DEVICE[0] = ctx.device
    r = ctx.rank
    x = _full((T_ROWS, 8), 10 + r)
    a = _full((T_ROWS, 32), 20 + r, torch.bfloat16)       # row-parallel: [M, K_local]
    w = _full((16, 32), 30 + r, torch.bfloat16)           # [N, K_local]
    wk = _full((16, 32), 40 + r, torch.bfloat16)          # column-parallel [N_local, K]
    seen = []

    def recording(gm, example_inputs):       # aot_eager, noting the ops Dynamo captured
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return torch._dynamo.lookup_backend(BACKEND)(gm, example_inputs)

    compiled = torch.compile(_eager_calls, fullgraph=True, backend=recording)
    want = _eager_calls(ctx, x, a, w, wk)
    for attempt in range(2):                              # a second call: the cached graph
        got = compiled(ctx, x, a, w, wk)
        for i, (gv, wv) in enumerate(zip(got, want)):
            _close(gv, wv, f"rank {r} output {i} call {attempt}", tol=1e-6 if i < 5 else 1e-2)
    captured = sorted({s.split(".")[1] for s in seen if s.startswith("trident.")})
    assert captured == sorted(["all_reduce_", "all_gather_into", "reduce_scatter_into",
                               "all_to_all_into", "broadcast_", "all_gather_matmul",
                               "matmul_reduce_scatter", "matmul_all_reduce",
                               "matmul_all_reduce_add_rmsnorm"]), (captured, seen)
    # the custom ops of GEMM + all-reduce + add + RMSNorm called directly: the functional
    # one leaves residual as it is, the in-place one (residual_out=residual) updates it
    residual = want[7].mul(0.5).contiguous()
    weight = residual[0].abs() + 0.5
    y, res = torch.ops.trident.matmul_all_reduce_add_rmsnorm(a, w, residual, weight, 1e-6,
                                                             None, ctx.name, "auto", None)
    _close(y, want[8], f"rank {r} torch.ops matmul_all_reduce_add_rmsnorm", 1e-2)
    _close(res, want[9], f"rank {r} torch.ops matmul_all_reduce_add_rmsnorm res", 1e-2)
    same = residual.clone()
    y_ = torch.ops.trident.matmul_all_reduce_add_rmsnorm_(a, w, same, weight, 1e-6, None,
                                                          ctx.name, "auto", None)
    _close(y_, y, f"rank {r} in-place twin", 1e-6)
    _close(same, res, f"rank {r} in-place twin: residual", 1e-6)
    _close(residual, want[7].mul(0.5), f"rank {r} functional form left residual", 0)
    # the in-place op mutates a graph input, as eagerly
    def inplace(t):
        ctx.all_reduce(t)
    t = x.clone()
    torch.compile(inplace, fullgraph=True, backend=BACKEND)(t)
    expect = x.clone()
    ctx.all_reduce(expect)
    _close(t, expect, f"rank {r} in-place all_reduce of a graph input", 1e-6)
    # a first call made inside torch.compile: Context's method has not yet been replaced
    # by ccl's entry (api/context_ops.py `_bound`), and tracing must not replace it
    def first_call(t):
        ctx.all_reduce(t)
    bound = OpMethods.__dict__["all_reduce"]
    OpMethods.all_reduce = UNBOUND["all_reduce"]
    try:
        t = x.clone()
        torch.compile(first_call, fullgraph=True, backend=BACKEND)(t)
        assert OpMethods.__dict__["all_reduce"] is UNBOUND["all_reduce"]
    finally:
        OpMethods.all_reduce = bound
    _close(t, expect, f"rank {r} all_reduce compiled before any eager call", 1e-6)
    ctx.sync()


def test_eager_calls_inside_compile(pool):
    pool.run(_check_eager_calls)


def _dynamo_loaded(ctx):
    import sys
    return "torch._dynamo" in sys.modules


def test_a_context_does_not_import_dynamo():
    """The stand-ins are registered without torch._dynamo (runtime/compiled.py): a fresh
    rank process that opens a context has not imported it (~2 s of CPU each)."""
    import trident as td
    assert td.launch(_dynamo_loaded, 1, backend="cpu") == [False]


# ---------------------------------------------------------------------------- TP MLP + grads
def _mlp_fp32(ctx, x, w1, w2):
    """Column-parallel up (local matmul), row-parallel down (functional all_reduce), then a
    reduce_scatter / all_gather round (sequence parallel)."""
    y = T.all_reduce(ctx, F.silu(x @ w1.t()) @ w2.t())
    z = T.reduce_scatter(ctx, y * 0.5)
    return T.all_gather(ctx, torch.tanh(z))


def _mlp_fused(ctx, x, w1, w2, b2, w3):
    """Sequence-parallel MLP on the fused ops: x [T/world, H] rows of this rank."""
    h = F.silu(ctx_ag_mm(ctx, x, w1))                     # [T, F/world]
    y = T.matmul_reduce_scatter(ctx, h, w2, b2)           # [T/world, H]
    y2 = T.matmul_all_reduce(ctx, h, w3)                  # [T, H]
    return y, y2


def ctx_ag_mm(ctx, x, w):
    return T.all_gather_matmul(ctx, x, w)


def _losses(parts, coefs):
    return sum((p.float() * c).sum() for p, c in zip(parts, coefs))


def _grads(fn, ctx, inputs, coefs):
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(ctx, *leaves)
    out = out if isinstance(out, tuple) else (out,)
    _losses(out, coefs).backward()
    return [o.detach() for o in out], [t.grad for t in leaves]


def _check_mlp(ctx):
    DEVICE[0] = ctx.device
    r, world = ctx.rank, ctx.world_size
    fs = FFN // world
    cols = slice(r * fs, (r + 1) * fs)
    rows = slice(r * T_ROWS // world, (r + 1) * T_ROWS // world)
    coefs = [[_full((T_ROWS, HID), 100 + q)] for q in range(world)]      # rank q's loss

    # fp32 model: compiled values == eager values; grads == single-process reference
    X, W1, W2 = _full((T_ROWS, HID), 1), _full((FFN, HID), 2) / 4, _full((HID, FFN), 3) / 4
    inputs = (X, W1[cols], W2[:, cols])
    eager_out, eager_grads = _grads(_mlp_fp32, ctx, inputs, coefs[r])
    compiled = torch.compile(_mlp_fp32, fullgraph=True, backend=BACKEND)
    comp_out, comp_grads = _grads(compiled, ctx, inputs, coefs[r])
    _close(comp_out[0], eager_out[0], f"rank {r} fp32 MLP compiled vs eager")
    for i, (c, e) in enumerate(zip(comp_grads, eager_grads)):
        _close(c, e, f"rank {r} fp32 MLP grad {i} compiled vs eager")
    ref = [t.clone().requires_grad_(True) for t in (X, W1, W2)]
    y = F.silu(ref[0] @ ref[1].t()) @ ref[2].t()
    z = torch.tanh(world * y * 0.5)
    _close(eager_out[0], z.detach(), f"rank {r} fp32 MLP vs reference")
    sum((z * coefs[q][0]).sum() for q in range(world)).backward()
    x_grad = comp_grads[0].clone()
    ctx.all_reduce(x_grad)                # x is replicated: its gradient is the ranks' sum
    _close(x_grad, ref[0].grad, f"rank {r} dx", 1e-4)
    _close(comp_grads[1], ref[1].grad[cols], f"rank {r} dW1", 1e-4)
    _close(comp_grads[2], ref[2].grad[:, cols], f"rank {r} dW2", 1e-4)

    # bf16 fused ops (fused kernels forced): compiled == eager; grads == reference
    bf = torch.bfloat16
    X, W1, W2 = _full((T_ROWS, HID), 4, bf), _full((FFN, HID), 5, bf), _full((HID, FFN), 6, bf)
    B2, W3 = _full((HID,), 7, bf), _full((HID, FFN), 8, bf)
    inputs = (X[rows], W1[cols], W2[:, cols].contiguous(), B2, W3[:, cols].contiguous())
    coef2 = [[_full((T_ROWS // world, HID), 200 + q), _full((T_ROWS, HID), 300 + q)]
             for q in range(world)]
    eager_out, eager_grads = _grads(_mlp_fused, ctx, inputs, coef2[r])
    compiled = torch.compile(_mlp_fused, fullgraph=True, backend=BACKEND)
    comp_out, comp_grads = _grads(compiled, ctx, inputs, coef2[r])
    for i, (c, e) in enumerate(zip(comp_out + comp_grads, eager_out + eager_grads)):
        _close(c, e, f"rank {r} fused MLP value/grad {i} compiled vs eager", 1e-6)
    ref = [t.float().clone().requires_grad_(True) for t in (X, W1, W2, B2, W3)]
    h = F.silu(ref[0] @ ref[1].t())
    y, y2 = h @ ref[2].t() + ref[3], h @ ref[4].t()
    block = T_ROWS // world
    sum((y[q * block:(q + 1) * block] * coef2[q][0]).sum() + (y2 * coef2[q][1]).sum()
        for q in range(world)).backward()
    tol = 3e-2
    _close(comp_out[0], y[rows].detach(), f"rank {r} fused y", tol)
    _close(comp_out[1], y2.detach(), f"rank {r} fused y2", tol)
    for name, got, want in (("dx", comp_grads[0], ref[0].grad[rows]),
                            ("dW1", comp_grads[1], ref[1].grad[cols]),
                            ("dW2", comp_grads[2], ref[2].grad[:, cols]),
                            ("db2", comp_grads[3], ref[3].grad),
                            ("dW3", comp_grads[4], ref[4].grad[:, cols])):
        _close(got, want, f"rank {r} fused {name}", tol)
    ctx.sync()


def test_tp_mlp_compiled_and_grads(pool):
    pool.run(_check_mlp)


# ---------------------------------------------------------------------------- opcheck
def _check_opcheck(ctx):
    DEVICE[0] = ctx.device
    from torch.library import opcheck
    r, world, name = ctx.rank, ctx.world_size, ctx.name
    x = _full((2 * world, 4), 50 + r)
    a = _full((2 * world, 32), 60 + r, torch.bfloat16)
    w = _full((8, 32), 70 + r, torch.bfloat16)
    bias = _full((8,), 80, torch.bfloat16)
    ops = torch.ops.trident
    cases = [
        (ops.all_reduce_, (x.clone(), name, "sum", None)),
        (ops.all_gather_into, (x.new_empty(world * x.shape[0], 4), x, name, None)),
        (ops.reduce_scatter_into, (x.new_empty(2, 4), x, name, "sum", None)),
        (ops.all_to_all_into, (torch.empty_like(x), x, None, None, name, None)),
        (ops.broadcast_, (x.clone(), 0, name, None)),
        (ops.all_reduce, (x.requires_grad_(), name, "sum", None)),
        (ops.all_gather, (x, name, None)),
        (ops.reduce_scatter, (x, name, "sum", None)),
        (ops.all_to_all, (x, [2] * world, [2] * world, name, None)),
        (ops.broadcast, (x, world - 1, name, None)),
        (ops.all_gather_matmul, (a[:2], w, bias, name, "fused")),
        (ops.matmul_reduce_scatter, (a, w, bias, name, "fused")),
        (ops.matmul_all_reduce, (a.requires_grad_(), w.requires_grad_(), None, name, "fused")),
        # the fused ops' options (a GEMM config family), as compiled graphs pass them
        (ops.matmul_all_reduce, (a, w, bias, name, "fused",
                                 "{'config': {'SWAP_AB': True}, 'gemm': 'tma', 'split_k': 2}")),
    ]
    for op, args in cases:
        opcheck(op, args)
    # the functional form takes the options as keywords, as the eager call does
    opts = dict(gemm="classic", config={"SWAP_AB": True}, split_k=2)
    with torch.no_grad():
        _close(T.matmul_all_reduce(ctx, a, w, bias, "fused", **opts),
               ctx.matmul_all_reduce(a, w, bias, algorithm="fused", **opts),
               f"rank {r} matmul_all_reduce with options", 0)
    try:
        T.matmul_all_reduce(ctx, a, w, bias, "fused", config={"BM": [16]})
    except TypeError as e:
        assert "cannot go through torch.compile" in str(e), e
    else:
        raise AssertionError("an option that is not a literal passed")
    # MoE: dispatch as an op (schema, fake, registration); combine's eager call needs the
    # object's latest dispatch, which opcheck's repeated calls keep (same inputs)
    import trident as td
    ep = td.ExpertParallel(ctx, num_experts=2 * world, experts_per_token=2, hidden_dim=16,
                           max_num_tokens=8, dtype=torch.float32)
    try:
        g = torch.Generator().manual_seed(r)
        tokens = torch.randn(6, 16, generator=g).to(ctx.device)
        idx = torch.stack([torch.randperm(2 * world, generator=g)[:2] for _ in range(6)])
        idx, weights = idx.to(ctx.device), torch.rand(6, 2, generator=g).to(ctx.device)
        # expert_x rows come in arrival order, which differs between calls at 3+ ranks, so
        # the check that compares two calls' outputs (test_aot_dispatch_dynamic) cannot
        # apply; every rank skips it alike (a rank that raised alone left the others
        # waiting in the next dispatch)
        opcheck(ops.moe_dispatch, (tokens, idx, weights, ep.name),
                test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
        expert_x, counts = ops.moe_dispatch(tokens, idx, weights, ep.name)
        opcheck(ops.moe_combine, (expert_x, None, ep.name, 6))
        y = ops.moe_combine(expert_x, None, ep.name, 6)
        _close(y, (weights.unsqueeze(-1) * tokens.unsqueeze(1)).sum(1), f"rank {r} moe", 1e-5)
    finally:
        ep.close()
    ctx.sync()


def test_opcheck(pool):
    pool.run(_check_opcheck)
