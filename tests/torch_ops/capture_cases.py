"""Every public op as a capture case: `inputs(i)` (this rank's inputs of call i, new random
data per call), `fn(*inputs)` (the op on them, inputs left unchanged: in-place ops work on
a copy) and `expected(i)` (plain torch on every rank's inputs of call i, rebuilt from the
same seeds). The same case runs eagerly, replayed from a CUDA graph, through
torch.compile(mode="reduce-overhead") (tests/torch_ops/test_capture_all.py) and under a
fake capture on the CPU emulation (tests/plans/test_capture_safety.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from trident.ccl.add_rmsnorm import ALGORITHMS as ADD_RMSNORM_ALGORITHMS
from trident.ops import schedules

from .. import algorithms
from ..ops.reference import assert_close, make

ROWS, HIDDEN = 4, 512          # all_reduce_add_rmsnorm
EPS = 1e-5


def _n(ctx) -> int:
    """Collectives: elements per rank (not a multiple of a block); fewer under the
    interpreter."""
    return 4096 + 17 if ctx.backend == "cuda" else 1024 + 17


def _mnk(ctx) -> tuple[int, int, int]:
    """Fused ops: rows (divisible by 1 to 4), outputs, K shard (multiples of 8: TMA);
    smaller under the interpreter, whose GEMM tiles are 16x32."""
    return (64, 256, 128) if ctx.backend == "cuda" else (24, 64, 32)


@dataclass
class Case:
    inputs: Callable             # i -> tuple of this rank's input tensors of call i
    fn: Callable                 # (*inputs) -> tuple of outputs
    expected: Callable           # i -> tuple of the outputs' references
    close: Callable = field(default=lambda: None)    # frees what the case made (collective)


def check(got, want, what: str) -> None:
    """Outputs against references: floats within bf16 rounding (relative to the
    reference's size), integers exactly."""
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for j, (g, w) in enumerate(zip(got, want)):
        if w.dtype.is_floating_point:
            assert_close(g, w, f"{what} output {j}")
        else:
            assert torch.equal(g.cpu(), w.cpu()), f"{what} output {j}: {g} != {w}"


def _per_rank(ctx, shape, dtype, seed):
    """Every rank's input of one call (the same on every rank: each builds all of them)."""
    return [make(shape, seed * 16 + p, dtype, ctx.device) for p in range(ctx.world_size)]


def _sum(xs):
    return torch.stack([x.float() for x in xs]).sum(0)


# ---------------------------------------------------------------------------- collectives
def all_reduce(ctx, algorithm):
    xs = lambda i: _per_rank(ctx, (_n(ctx),), torch.float32, 100 + i)  # noqa: E731

    def fn(x):
        t = x.clone()
        ctx.all_reduce(t, algorithm=algorithm)
        return (t,)
    return Case(lambda i: (xs(i)[ctx.rank],), fn, lambda i: (_sum(xs(i)),))


def all_gather(ctx, algorithm):
    xs = lambda i: _per_rank(ctx, (_n(ctx),), torch.bfloat16, 200 + i)  # noqa: E731

    def fn(x):
        out = x.new_empty(ctx.world_size * x.shape[0])
        ctx.all_gather(out, x, algorithm=algorithm)
        return (out,)
    return Case(lambda i: (xs(i)[ctx.rank],), fn, lambda i: (torch.cat(xs(i)),))


def reduce_scatter(ctx, algorithm):
    w = ctx.world_size
    xs = lambda i: _per_rank(ctx, (w * _n(ctx),), torch.float32, 300 + i)  # noqa: E731

    def fn(x):
        out = x.new_empty(x.shape[0] // w)
        ctx.reduce_scatter(out, x, algorithm=algorithm)
        return (out,)
    return Case(lambda i: (xs(i)[ctx.rank],), fn,
                lambda i: (_sum(xs(i)).chunk(w)[ctx.rank],))


def all_to_all(ctx, algorithm):
    w = ctx.world_size
    xs = lambda i: _per_rank(ctx, (w * 8, 3), torch.float16, 400 + i)  # noqa: E731

    def fn(x):
        out = torch.empty_like(x)
        ctx.all_to_all(out, x, algorithm=algorithm)
        return (out,)
    return Case(lambda i: (xs(i)[ctx.rank],), fn,
                lambda i: (torch.cat([x.chunk(w)[ctx.rank] for x in xs(i)]),))


def broadcast(ctx, algorithm):
    src = ctx.world_size - 1
    xs = lambda i: _per_rank(ctx, (_n(ctx),), torch.float32, 500 + i)  # noqa: E731

    def fn(x):
        t = x.clone()
        ctx.broadcast(t, src=src, algorithm=algorithm)
        return (t,)
    return Case(lambda i: (xs(i)[ctx.rank],), fn, lambda i: (xs(i)[src],))


def add_rmsnorm(ctx, algorithm):
    """x differs per rank; residual and weight are the same everywhere (the replicated
    residual stream of tensor parallelism)."""
    bf = torch.bfloat16
    xs = lambda i: _per_rank(ctx, (ROWS, HIDDEN), bf, 600 + i)  # noqa: E731
    shared = lambda i: (make((ROWS, HIDDEN), 6100 + i, bf, ctx.device),  # noqa: E731
                        make((HIDDEN,), 6200 + i, bf, ctx.device))

    def fn(x, residual, weight):
        res = residual.clone()
        out = ctx.all_reduce_add_rmsnorm(x, res, weight, EPS, algorithm=algorithm)
        return out, res

    def expected(i):
        residual, weight = shared(i)
        r = (residual.float() + _sum(xs(i))).to(bf)
        rf = r.float()
        out = rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()
        return out, r
    return Case(lambda i: (xs(i)[ctx.rank], *shared(i)), fn, expected)


# ---------------------------------------------------------------------------- fused ops
# The config families of the fused ops' GEMM core (trident/ops/fused_tile.py), forced
# through the ops' options: the classic core (a program per tile, pointer loads), the
# persistent TMA core with a plain tile, swap-AB, split-K (2 slices: with the small K
# here some slices are empty, which must still work), both (the H200 table's decode
# choice) and split-K with swap-AB on the classic core. Tiles come from the GEMM table
# (the interpreter's own on the CPU emulation).
FAMILIES = {
    "classic": dict(gemm="classic"),
    "tma": dict(gemm="tma", config={"SWAP_AB": False, "SPLIT_K": 1}),
    "swab": dict(gemm="tma", config={"SWAP_AB": True, "SPLIT_K": 1}),
    "split": dict(gemm="tma", config={"SWAP_AB": False}, split_k=2),
    "swab_split": dict(gemm="tma", config={"SWAP_AB": True}, split_k=2),
    "classic_swab_split": dict(gemm="classic", config={"SWAP_AB": True}, split_k=2),
    # all_gather_matmul's Gluon kernel on sm_90 GPUs (the "tma" core elsewhere, and for
    # the row-parallel ops)
    "gluon": dict(gemm="gluon"),
    "gluon_split": dict(gemm="gluon", split_k=2),
}
# the fused ops' other schedules (trident/ops/schedules.py: every registered one but
# "fused", whose families are above, and "plain"), with their defaults; "async_tp"
# (torch's async-TP) has no matmul_all_reduce and runs on GPUs of their own only
SCHEDULES = [n for n in schedules.registered() if n not in ("fused", "plain")]
FUSED_VARIANTS = ["fused/" + f for f in FAMILIES] + SCHEDULES + ["auto", "plain"]


def fused_variants(op: str) -> list[str]:
    """FUSED_VARIANTS that `op` has (a schedule registered for other ops only is left out)."""
    return [v for v in FUSED_VARIANTS if v not in SCHEDULES or op in schedules.get(v).ops]


def family_options(family: str | None) -> dict:
    """A fresh copy of a family's options (None: the op's defaults)."""
    if family is None:
        return {}
    opts = dict(FAMILIES[family])
    if "config" in opts:
        opts["config"] = dict(opts["config"])
    return opts


def _fused_call(ctx, op, algorithm, family):
    options = family_options(family)
    return lambda a, w, b: (getattr(ctx, op)(a, w, b, algorithm=algorithm, **options),)


def row_parallel(op):
    """matmul_all_reduce / matmul_reduce_scatter: rank r holds columns [r*K, (r+1)*K) of
    A [M, world*K] and W [N_OUT, world*K]; the bias [N_OUT] is the same everywhere."""
    def case(ctx, algorithm, family=None):
        w, r, bf = ctx.world_size, ctx.rank, torch.bfloat16
        M, N_OUT, K = _mnk(ctx)

        def full(i):
            return (make((M, w * K), 700 + i, bf, ctx.device),
                    make((N_OUT, w * K), 7100 + i, bf, ctx.device),
                    make((N_OUT,), 7200 + i, bf, ctx.device))

        def inputs(i):
            a, wt, b = full(i)
            cols = slice(r * K, (r + 1) * K)
            return a[:, cols].contiguous(), wt[:, cols].contiguous(), b

        def expected(i):
            a, wt, b = full(i)
            ref = a.float() @ wt.float().T + b.float()
            return (ref if op == "matmul_all_reduce" else ref.chunk(w)[r],)
        return Case(inputs, _fused_call(ctx, op, algorithm, family), expected)
    return case


def all_gather_matmul(ctx, algorithm, family=None):
    """Rank r holds rows [r*M/world, ...) of A [M, K] and its own W [N_OUT, K] and bias."""
    w, r, bf = ctx.world_size, ctx.rank, torch.bfloat16
    M, N_OUT, K = _mnk(ctx)
    rows = M // w
    a_full = lambda i: make((M, K), 800 + i, bf, ctx.device)  # noqa: E731
    mine = lambda i: (make((N_OUT, K), 8100 + 16 * i + r, bf, ctx.device),  # noqa: E731
                      make((N_OUT,), 8200 + 16 * i + r, bf, ctx.device))

    def expected(i):
        wt, b = mine(i)
        return (a_full(i).float() @ wt.float().T + b.float(),)
    return Case(lambda i: (a_full(i)[r * rows:(r + 1) * rows].contiguous(), *mine(i)),
                _fused_call(ctx, "all_gather_matmul", algorithm, family), expected)


# ---------------------------------------------------------------------------- MoE
def moe(ctx, path, tokens=8, hidden=128, max_num_tokens=16, scale=2):
    """dispatch then combine through trident's torch ops, with expert_y = scale * expert_x:
    every token comes back as scale * x * (sum of its weights); expert_num_tokens counts the
    tokens every rank routed to this rank's experts. path: "low_latency" or
    "high_throughput" (the kernels of each); tokens per rank and call; scale 1 passes
    expert_x on as it is (a graph of trident's ops only, no kernel of Inductor's own)."""
    from trident import ExpertParallel
    world, topk = ctx.world_size, 2
    experts = 2 * world
    ep = ExpertParallel(ctx, experts, topk, hidden, max_num_tokens, dtype=torch.bfloat16,
                        high_throughput=path == "high_throughput")

    def data(i, p):
        g = torch.Generator().manual_seed(900 + 16 * i + p)
        x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
        idx = torch.stack([torch.randperm(experts, generator=g)[:topk] for _ in range(tokens)])
        wts = torch.rand(tokens, topk, generator=g)
        return x.to(ctx.device), idx.to(ctx.device), wts.to(ctx.device)

    def fn(x, idx, wts):
        expert_x, counts = torch.ops.trident.moe_dispatch(x, idx, None, ep.name)
        expert_y = expert_x if scale == 1 else expert_x * scale
        y = torch.ops.trident.moe_combine(expert_y, wts, ep.name, x.shape[0])
        return y, counts

    def expected(i):
        x, _, wts = data(i, ctx.rank)
        ids = torch.cat([data(i, p)[1].flatten() for p in range(world)])
        local = torch.arange(ep.num_local_experts, device=ctx.device) + ctx.rank * ep.num_local_experts
        counts = (ids[None, :] == local[:, None]).sum(1).to(torch.int32)
        return scale * x.float() * wts.sum(1, keepdim=True), counts
    return Case(lambda i: data(i, ctx.rank), fn, expected, ep.close)


# ---------------------------------------------------------------------------- the list
def _collective(op: str) -> list[str]:
    """A collective's variants: every algorithm of the registry (tests/algorithms.py),
    "auto" and "nccl"."""
    return sorted(algorithms.kernels(op)) + ["auto", "nccl"]


# name -> (make(ctx, variant) -> Case, its variants: algorithms, or "algorithm/family"
# (a config family of FAMILIES))
CASES = {
    "all_reduce": (all_reduce, _collective("all_reduce")),
    "all_gather": (all_gather, _collective("all_gather")),
    "reduce_scatter": (reduce_scatter, _collective("reduce_scatter")),
    "all_to_all": (all_to_all, _collective("all_to_all")),
    "broadcast": (broadcast, _collective("broadcast")),
    "all_reduce_add_rmsnorm": (add_rmsnorm, [*ADD_RMSNORM_ALGORITHMS, "auto"]),
    "all_gather_matmul": (all_gather_matmul, fused_variants("all_gather_matmul")),
    "matmul_reduce_scatter": (row_parallel("matmul_reduce_scatter"),
                              fused_variants("matmul_reduce_scatter")),
    "matmul_all_reduce": (row_parallel("matmul_all_reduce"), fused_variants("matmul_all_reduce")),
    "moe": (moe, ["low_latency", "high_throughput"]),
}
# torch.distributed / torch's symmetric memory: not where ranks share a GPU
NCCL_VARIANTS = ("nccl", "plain", "async_tp")
GPU_VARIANTS = ("async_tp",)          # torch's symmetric memory: not on the CPU emulation


def all_variants() -> list[tuple[str, str]]:
    return [(name, v) for name, (_, variants) in CASES.items() for v in variants]


def make_case(ctx, name: str, variant: str) -> Case:
    build, _ = CASES[name]
    if "/" in variant:                                  # fused op: algorithm/family
        algorithm, family = variant.split("/")
        return build(ctx, algorithm, family)
    return build(ctx, variant)


def combined(cases: list[Case]) -> Case:
    """Several cases as one (one function, one graph): inputs and outputs concatenated."""
    sizes = [len(c.inputs(0)) for c in cases]

    def fn(*args):
        outs, at = [], 0
        for c, n in zip(cases, sizes):
            outs.extend(c.fn(*args[at:at + n]))
            at += n
        return tuple(outs)

    def close():
        for c in cases:
            c.close()
    return Case(lambda i: tuple(t for c in cases for t in c.inputs(i)), fn,
                lambda i: tuple(t for c in cases for t in c.expected(i)), close)
