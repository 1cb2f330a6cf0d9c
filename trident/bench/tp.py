"""`trident bench tp`: a tensor-parallel decode step of Llama-3-8B-shaped layers with the
row-parallel sum + residual add + RMSNorm done five ways, in one run.

Each layer (per rank, TP = world size): qkv GEMM (column-parallel) -> attention of the new
token over a KV cache (this rank's heads, context 1024) -> o_proj GEMM (row-parallel
partial) -> SUM_NORM -> gate/up GEMM -> SiLU * up -> down GEMM (row-parallel partial) ->
SUM_NORM, where SUM_NORM(partial, residual, w) is: residual += all-reduce sum of partial
(in place); h = rmsnorm(residual) * w (the next GEMM's input). Implementations of SUM_NORM:
  nccl            torch.distributed all_reduce + torch add / rmsnorm (its rows are named
                  "gloo" on the CPU emulation, whose process group is gloo)
  torch_symm_mem  copy into a symmetric buffer + torch.ops.symm_mem.one_shot_all_reduce
                  (never multimem ops) + torch add / rmsnorm (GPUs, where torch has it)
  trident         ctx.all_reduce + torch add / rmsnorm
  trident_fused   ctx.all_reduce_add_rmsnorm: one kernel (trident/ccl/add_rmsnorm.py)
  trident_fused_lamport  the same with algorithm="lamport" (its Lamport exchange)
  trident_matmul_fused  the row-parallel GEMM and SUM_NORM in one kernel:
                  ctx.matmul_all_reduce_add_rmsnorm (its NORM kernel: trident/ops/epilogue_lamport.py)
Rows: kind "step" (a whole decode step of --layers layers), kind "sum_norm" (SUM_NORM
alone on [batch, hidden]; with trident_all_reduce_alone, ctx.all_reduce alone, for the
issue's target: fused <= 1.2x the all-reduce alone; not trident_matmul_fused, whose GEMM is
inside) and kind "linear" (the down projection's GEMM + SUM_NORM, each implementation's
way -- cuBLAS then SUM_NORM, or the one kernel --, with cublas_gemm_alone, the GEMM alone;
over_gemm_us = time - the GEMM's, device times). Times from common.time_modes: eager
(calls back to back) and graph (replayed from one CUDA graph), max over ranks. The final
hidden state of one step is checked against the nccl implementation's (rel_err). Where
ranks share a GPU, NCCL cannot run: its rows say so (`note`) and rel_err is taken against
the same step with the sum done by the host group on CPU copies.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        trident bench tp --world-size 2            # Llama-3-8B layers, batch 1,2,4,8
On the CPU emulation (tiny sizes) it only shows that every path runs and agrees.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..runtime import options
from . import common

DTYPE = torch.bfloat16
EPS = 1e-5
IMPLS = ("nccl", "torch_symm_mem", "trident", "trident_fused", "trident_fused_lamport",
         "trident_matmul_fused")
ONE_KERNEL = "trident_matmul_fused"       # GEMM + SUM_NORM: no sum_norm row of its own


@dataclass
class Shape:
    layers: int = 4
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 14336
    context: int = 1024


LLAMA3_8B = Shape()
TINY = Shape(layers=2, hidden=64, heads=4, kv_heads=4, ffn=96, context=8)


def _weights(ctx, s: Shape, batch: int) -> dict:
    """This rank's shards (random), and norm weights / residual equal on every rank."""
    w, hd = ctx.world_size, s.hidden // s.heads
    hq, hk, fl = s.heads // w, s.kv_heads // w, s.ffn // w
    g = torch.Generator(device=ctx.device).manual_seed(100 + ctx.rank)
    same = torch.Generator(device=ctx.device).manual_seed(7)

    def rnd(*shape, gen=g, scale=None):
        return (torch.randn(*shape, generator=gen, device=ctx.device)
                * (scale or shape[-1] ** -0.5)).to(DTYPE)
    layers = [dict(qkv=rnd((hq + 2 * hk) * hd, s.hidden), o=rnd(s.hidden, hq * hd),
                   gate_up=rnd(2 * fl, s.hidden), down=rnd(s.hidden, fl),
                   k_cache=rnd(batch, hk, s.context, hd, scale=1.0),
                   v_cache=rnd(batch, hk, s.context, hd, scale=1.0),
                   norm_attn=rnd(s.hidden, gen=same, scale=1.0).abs() + 0.5,
                   norm_mlp=rnd(s.hidden, gen=same, scale=1.0).abs() + 0.5)
              for _ in range(s.layers)]
    return dict(layers=layers, residual=rnd(batch, s.hidden, gen=same, scale=1.0),
                hq=hq, hk=hk, hd=hd)


def torch_add_rmsnorm(s, residual, weight):
    residual.add_(s)
    rf = residual.float()
    return (rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + EPS)).to(DTYPE) * weight


def _sum_norms(ctx, batch: int, hidden: int) -> dict:
    """name -> sum_norm(partial, residual, weight) -> h."""
    impls = {
        "nccl": lambda p, r, w: torch_add_rmsnorm(
            (dist.all_reduce(p, group=ctx.group), p)[1], r, w),
        "trident": lambda p, r, w: torch_add_rmsnorm(ctx.all_reduce(p), r, w),
        "trident_fused": lambda p, r, w: ctx.all_reduce_add_rmsnorm(p, r, w, EPS),
        "trident_fused_lamport": lambda p, r, w: ctx.all_reduce_add_rmsnorm(
            p, r, w, EPS, algorithm="lamport"),
    }
    if not common.nccl_runs(ctx):
        del impls["nccl"]
    if ctx.backend == "cuda":
        try:
            import torch.distributed._symmetric_memory as symm_mem
            if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce"):
                raise RuntimeError("no torch.ops.symm_mem.one_shot_all_reduce")
            name = ctx.group.group_name
            if hasattr(symm_mem, "enable_symm_mem_for_group"):
                symm_mem.enable_symm_mem_for_group(name)
            buf = symm_mem.empty(batch, hidden, dtype=DTYPE, device=ctx.device)
            symm_mem.rendezvous(buf, group=name)

            def tsm(p, r, w):
                buf.copy_(p)
                return torch_add_rmsnorm(
                    torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", name), r, w)
            impls["torch_symm_mem"] = tsm
        except Exception as exc:             # noqa: BLE001 -- torch without it: no column
            if ctx.rank == 0:
                print(f"torch_symm_mem skipped: {type(exc).__name__}: {str(exc)[:120]}")
    return impls


def _host_sum_norm(ctx):
    """SUM_NORM with the sum taken by the host group (gloo) on fp32 CPU copies: the
    reference of rel_err where NCCL cannot run (ranks that share a GPU); never timed."""
    def sum_norm(p, r, w):
        s = p.float().cpu()
        dist.all_reduce(s, group=ctx.group)
        return torch_add_rmsnorm(s.to(p.device, p.dtype), r, w)
    return sum_norm


def _linears(ctx, sum_norms: dict, names) -> dict:
    """name -> linear(x, w, residual, weight) -> h: the row-parallel GEMM x @ w.T (this
    rank's partial), then SUM_NORM -- cuBLAS and each of `sum_norms`, or the one kernel."""
    out = {name: (lambda x, w, r, nw, f=f: f(x @ w.t(), r, nw)) for name, f in sum_norms.items()}
    if ONE_KERNEL in names:
        out[ONE_KERNEL] = lambda x, w, r, nw: ctx.matmul_all_reduce_add_rmsnorm(   # in place
            x, w, r, nw, EPS, residual_out=r)[0]
    return out


def decode_step(linear, s: Shape, wts: dict, residual, h):
    """One decode step over every layer; h = rmsnorm of residual at entry; returns the
    final h (residual is updated in place). linear: _linears' form of SUM_NORM."""
    hq, hk, hd = wts["hq"], wts["hk"], wts["hd"]
    for lw in wts["layers"]:
        q, k, v = (h @ lw["qkv"].t()).split([hq * hd, hk * hd, hk * hd], -1)
        q = q.view(-1, hq, 1, hd)
        k = torch.cat([lw["k_cache"], k.view(-1, hk, 1, hd)], 2)
        v = torch.cat([lw["v_cache"], v.view(-1, hk, 1, hd)], 2)
        att = F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hk)
        h = linear(att.reshape(-1, hq * hd), lw["o"], residual, lw["norm_mlp"])
        gate, up = (h @ lw["gate_up"].t()).chunk(2, -1)
        h = linear(F.silu(gate) * up, lw["down"], residual, lw["norm_attn"])
    return h


def _bench(ctx, shape: Shape, batches, impl_names, timing) -> list[dict]:
    rows = []
    for batch in batches:
        wts = _weights(ctx, shape, batch)
        sums = {k: v for k, v in _sum_norms(ctx, batch, shape.hidden).items()
                if k in impl_names}
        impls = _linears(ctx, sums, impl_names)
        h0 = torch_add_rmsnorm(torch.zeros_like(wts["residual"]), wts["residual"].clone(),
                               wts["layers"][0]["norm_attn"])
        # correctness: one step from the same state, against nccl's
        finals = {}
        for name, fn in impls.items():
            finals[name] = decode_step(fn, shape, wts, wts["residual"].clone(), h0).float()
        base = finals.get("nccl")
        if base is None and not common.nccl_runs(ctx):
            base = decode_step(_linears(ctx, {"host": _host_sum_norm(ctx)}, ())["host"],
                               shape, wts, wts["residual"].clone(), h0).float()
        residual = wts["residual"].clone()
        g = torch.Generator(device=ctx.device).manual_seed(1 + ctx.rank)
        partial = torch.randn(batch, shape.hidden, generator=g, device=ctx.device).to(DTYPE)
        op_res = torch.randn(batch, shape.hidden, device=ctx.device,
                             generator=torch.Generator(device=ctx.device).manual_seed(3)
                             ).to(DTYPE)
        norm_w = wts["layers"][0]["norm_attn"]
        down = wts["layers"][0]["down"]
        act = torch.randn(batch, down.shape[1], generator=g, device=ctx.device).to(DTYPE)
        alone = {}
        ar_buf = partial.clone()
        t_ar = common.time_modes_or_skip(ctx, lambda: ctx.all_reduce(ar_buf), **timing)
        t_gemm = common.time_modes_or_skip(ctx, lambda: act @ down.t(), **timing)
        linear_rows = []
        for name, fn in impls.items():
            t_step = common.time_modes_or_skip(
                ctx, lambda fn=fn: decode_step(fn, shape, wts, residual, h0), **timing)
            kinds = [("step", t_step)]
            if name in sums:                # the op alone (all_reduce is in place)
                buf = partial.clone()
                kinds.append(("sum_norm", common.time_modes_or_skip(
                    ctx, lambda f=sums[name], buf=buf: f(buf, op_res, norm_w), **timing)))
                alone[name] = kinds[-1][1]
            t_lin = common.time_modes_or_skip(ctx, lambda fn=fn: fn(act, down, op_res, norm_w),
                                              **timing)
            err = None
            if base is not None:
                err = ((finals[name] - base).abs().max() / base.abs().max().clamp_min(1e-6)).item()
                err = common.max_over_ranks(ctx, err)
            for kind, t in kinds:
                rows.append(dict(kind=kind, batch=batch, layers=shape.layers, impl=name,
                                 rel_err=err, **t))
            over = common.device_us(t_lin) - common.device_us(t_gemm) \
                if common.device_us(t_lin) and common.device_us(t_gemm) else None
            linear_rows.append(dict(kind="linear", batch=batch, layers=shape.layers, impl=name,
                                    rel_err=err, over_gemm_us=over, **t_lin))
        if "nccl" in impl_names and "nccl" not in impls:
            rows += [dict(kind=kind, batch=batch, layers=shape.layers, impl="nccl",
                          rel_err=None, **common.skipped(common.NO_NCCL))
                     for kind in ("step", "sum_norm", "linear")]
        rows.append(dict(kind="sum_norm", batch=batch, layers=shape.layers,
                         impl="trident_all_reduce_alone", rel_err=None, **t_ar))
        ar_alone = rows[-1]
        rows += linear_rows
        rows.append(dict(kind="linear", batch=batch, layers=shape.layers,
                         impl="cublas_gemm_alone", rel_err=None, **t_gemm))
        for kind in ("step", "sum_norm", "linear"):
            nccl = next((r for r in rows if r["kind"] == kind and r["batch"] == batch
                         and r["impl"] == "nccl"), None)
            for r in rows:
                if r["kind"] == kind and r["batch"] == batch and nccl is not None:
                    r["eager_vs_nccl"] = common.ratio(nccl["eager_us"], r["eager_us"])
                    r["graph_vs_nccl"] = common.ratio(nccl["graph_us"], r["graph_us"])
        fused = alone.get("trident_fused")
        if fused:
            ar_alone["fused_vs_all_reduce"] = common.ratio(common.device_us(fused),
                                                           common.device_us(t_ar))
        del wts, impls
        ctx.barrier()
    for r in rows:                  # the baseline by what it is: gloo on the CPU emulation
        if r["impl"] == "nccl":
            r["impl"] = common.baseline_name(ctx)
    return rows


COLUMNS = ["kind", "batch", "layers", "impl", "eager_us", "graph_us", "host_us",
           "eager_vs_nccl", "graph_vs_nccl", "fused_vs_all_reduce", "over_gemm_us", "rel_err"]
ABOUT = ("step: one decode step of `layers` Llama-3-8B-shaped layers (TP = world size), "
         "us per step; sum_norm: the all-reduce + residual add + RMSNorm alone on "
         "[batch, hidden] (trident_all_reduce_alone: ctx.all_reduce alone; "
         "fused_vs_all_reduce = trident_fused / all-reduce alone, device time); linear: the "
         "down projection's GEMM + all-reduce + add + norm (cublas_gemm_alone: the GEMM "
         "alone; over_gemm_us = device time - the GEMM's); eager_us: "
         "calls back to back, graph_us: replayed from a CUDA graph; max over ranks; "
         "*_vs_nccl = nccl time / time (gloo on the CPU emulation); rel_err: final hidden state of one step vs nccl's "
         "(where NCCL cannot run: vs the host group's sum on CPU copies)")


def _run(ctx, shape, batches, impls, timing, out_dir):
    rows = _bench(ctx, shape, batches, impls, timing)
    if ctx.rank != 0:
        return None
    if common.headline(ctx):
        print(common.headline(ctx))
    common.print_table(rows, COLUMNS)
    extra = {"dtype": str(DTYPE), "shape": shape.__dict__, "columns": ABOUT}
    path = common.write_results(ctx, "tp", rows, extra, out_dir=out_dir)
    print(f"results: {path}")
    return path


def main(argv=None) -> int:
    from ..runtime.launch import default_backend, launch
    p = common.suite_parser("trident bench tp", __doc__, list(IMPLS))
    p.add_argument("--batch", default=None, help="comma-separated batch sizes (default 1,2,4,8 "
                   "on GPUs, 2 on CPU)")
    p.add_argument("--layers", type=int, default=None, help="layers per step (default 4)")
    p.add_argument("--tiny", action="store_true", help="tiny layer sizes (default on CPU)")
    args = p.parse_args(argv)
    backend = args.backend or default_backend()
    gpu = backend == "cuda"
    impls = common.parse_ops(p, args.ops, list(IMPLS))
    shape = TINY if args.tiny or not gpu else LLAMA3_8B
    if args.layers:
        shape = replace(shape, layers=args.layers)
    batches = [int(b) for b in args.batch.split(",")] if args.batch else \
        ([1, 2, 4, 8] if gpu else [2])
    world = args.world_size or common.default_world(backend)
    heap = (1 << 30) if gpu else (64 << 20)
    options.export_default("TRIDENT_HEAP_SIZE", heap)
    timing = {**common.timing_options(args, gpu), "synced_iters": 0}
    launch(_run, world, shape, batches, impls, timing, args.out_dir, backend=backend,
           heap_size=heap)
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
