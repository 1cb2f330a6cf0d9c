"""Tensor-parallel decode step of Llama-shaped layers with trident's ops under torch.compile.

    python examples/tp_decode.py               # GPUs: Llama-3-8B layer sizes, CUDA graphs
    python examples/tp_decode.py --tiny        # tiny sizes (what the CPU emulation runs)

Each layer: RMSNorm -> qkv (column-parallel, local GEMM) -> attention of the new token over
a cache (this rank's heads) -> o_proj (row-parallel: ctx.matmul_all_reduce) -> residual ->
RMSNorm -> gate/up (column-parallel) -> SiLU -> down (row-parallel: ctx.matmul_all_reduce,
or ctx.all_reduce after a local GEMM with --sum all_reduce) -> residual. With --sum fused
every row-parallel sum, its residual add and the RMSNorm after it are one kernel
(ctx.all_reduce_add_rmsnorm after the local GEMM; residual updated in place). The step is
compiled with torch.compile(fullgraph=True): on GPUs mode="reduce-overhead" (CUDA graphs),
on the CPU emulation backend="aot_eager". Logits are checked against the same weights
run in one process. Random weights, no downloads; the cache is not updated (a fixed-shape
step, enough to time and check the communication).
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import trident as td


@dataclass
class Shape:
    layers: int = 4
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 14336
    vocab: int = 4096          # a slice of the vocabulary: the example is about the layers
    context: int = 1024
    batch: int = 1


TINY = Shape(layers=2, hidden=64, heads=4, kv_heads=4, ffn=96, vocab=32, context=8, batch=2)


def make_weights(s: Shape, dtype, seed: int = 0) -> dict:
    """Full (unsharded) weights, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    hd = s.hidden // s.heads

    def rnd(*shape, scale=None):
        return (torch.randn(*shape, generator=g) * (scale or shape[-1] ** -0.5)).to(dtype)
    layers = [dict(qkv=rnd((s.heads + 2 * s.kv_heads) * hd, s.hidden), o=rnd(s.hidden, s.hidden),
                   gate=rnd(s.ffn, s.hidden), up=rnd(s.ffn, s.hidden), down=rnd(s.hidden, s.ffn),
                   k_cache=rnd(s.batch, s.kv_heads, s.context, hd, scale=1.0),
                   v_cache=rnd(s.batch, s.kv_heads, s.context, hd, scale=1.0))
              for _ in range(s.layers)]
    return dict(layers=layers, embed=rnd(s.vocab, s.hidden, scale=1.0), head=rnd(s.vocab, s.hidden))


def shard(w: dict, s: Shape, rank: int, world: int, device) -> dict:
    """This rank's heads and FFN columns (column-parallel rows, row-parallel columns)."""
    hd, hq, hk, fl = s.hidden // s.heads, s.heads // world, s.kv_heads // world, s.ffn // world
    out = []
    for lw in w["layers"]:
        q, k, v = lw["qkv"].split([s.heads * hd, s.kv_heads * hd, s.kv_heads * hd])
        heads = slice(rank * hq * hd, (rank + 1) * hq * hd)
        kvs = slice(rank * hk * hd, (rank + 1) * hk * hd)
        cols = slice(rank * fl, (rank + 1) * fl)
        out.append(dict(qkv=torch.cat([q[heads], k[kvs], v[kvs]]),
                        o=lw["o"][:, heads].contiguous(),
                        gate_up=torch.cat([lw["gate"][cols], lw["up"][cols]]),
                        down=lw["down"][:, cols].contiguous(),
                        k_cache=lw["k_cache"][:, rank * hk:(rank + 1) * hk],
                        v_cache=lw["v_cache"][:, rank * hk:(rank + 1) * hk]))
    moved = [{k: t.to(device) for k, t in lw.items()} for lw in out]
    return dict(layers=moved, embed=w["embed"].to(device), head=w["head"].to(device))


def rms_norm(x, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def step(row_parallel, s: Shape, heads: int, kv_heads: int, w: dict, tokens, sum_norm=None):
    """One decode step: tokens [B] -> logits [B, vocab]. `row_parallel(a, w)` is the
    row-parallel linear (the sum over ranks), identity-summed in the reference.
    `sum_norm(a, w, x) -> (x, h)`: x + row_parallel(a, w) and its RMSNorm (default: those
    two in turn; the fused op does both in one kernel)."""
    if sum_norm is None:
        def sum_norm(a, wt, x):
            x = x + row_parallel(a, wt)
            return x, rms_norm(x)
    hd = s.hidden // s.heads
    x = w["embed"][tokens]                                             # [B, H]
    h = rms_norm(x)
    for lw in w["layers"]:
        qkv = h @ lw["qkv"].t()
        q, k, v = qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], -1)
        q = q.view(-1, heads, 1, hd)
        k = torch.cat([lw["k_cache"], k.view(-1, kv_heads, 1, hd)], 2)
        v = torch.cat([lw["v_cache"], v.view(-1, kv_heads, 1, hd)], 2)
        k = k.repeat_interleave(heads // kv_heads, 1)
        v = v.repeat_interleave(heads // kv_heads, 1)
        att = F.scaled_dot_product_attention(q, k, v).reshape(-1, heads * hd)
        x, h = sum_norm(att, lw["o"], x)
        gate, up = (h @ lw["gate_up"].t()).chunk(2, -1)
        x, h = sum_norm(F.silu(gate) * up, lw["down"], x)
    return h.float() @ w["head"].float().t()


def main(ctx, shape: Shape = TINY, sum_with: str = "matmul_all_reduce", iters: int = 5):
    """Compile the rank's step, check its logits against one process, time it."""
    world, dev = ctx.world_size, ctx.device
    dtype = torch.bfloat16
    full = make_weights(shape, dtype)
    mine = shard(full, shape, ctx.rank, world, dev)
    tokens = torch.arange(shape.batch, device=dev) % shape.vocab

    sum_norm = None
    if sum_with == "fused":
        ones = torch.ones(shape.hidden, dtype=dtype, device=dev)

        def row_parallel(a, w):
            return ctx.all_reduce(a @ w.t())

        def sum_norm(a, w, x):      # x (the residual) is updated in place
            return x, ctx.all_reduce_add_rmsnorm(a @ w.t(), x, ones, 1e-5)
    elif sum_with == "matmul_all_reduce":
        def row_parallel(a, w):
            return ctx.matmul_all_reduce(a, w)
    else:
        def row_parallel(a, w):
            return ctx.all_reduce(a @ w.t())

    def tp_step(tokens):
        return step(row_parallel, shape, shape.heads // world, shape.kv_heads // world, mine,
                    tokens, sum_norm)
    if ctx.backend == "cuda":
        compiled = torch.compile(tp_step, fullgraph=True, mode="reduce-overhead")
    else:
        compiled = torch.compile(tp_step, fullgraph=True, backend="aot_eager")
    for _ in range(3 if ctx.backend == "cuda" else 1):   # compile, workspaces, graph capture
        logits = compiled(tokens).clone()
    ctx.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        logits = compiled(tokens).clone()
    if ctx.backend == "cuda":
        torch.cuda.synchronize()
    us = (time.perf_counter() - t0) / iters * 1e6

    ref_w = dict(layers=[dict(qkv=lw["qkv"], o=lw["o"], down=lw["down"],
                              gate_up=torch.cat([lw["gate"], lw["up"]]), k_cache=lw["k_cache"],
                              v_cache=lw["v_cache"]) for lw in full["layers"]],
                 embed=full["embed"], head=full["head"])
    ref_w = dict(layers=[{k: t.to(dev) for k, t in lw.items()} for lw in ref_w["layers"]],
                 embed=ref_w["embed"].to(dev), head=ref_w["head"].to(dev))
    # the reference's gate_up halves are whole (gate then up), the shards' per rank: chunk
    # in step() splits each at its middle, so both pair gate and up columns correctly
    ref = step(lambda a, w: a @ w.t(), shape, shape.heads, shape.kv_heads, ref_w, tokens)
    err = (logits - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
    ctx.sync()
    return dict(rank=ctx.rank, us_per_step=round(us, 1), rel_err=err)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=None, help="ranks (default: every GPU, or 2 CPU ranks)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes (default on the CPU emulation)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--sum", default="matmul_all_reduce", choices=["matmul_all_reduce", "all_reduce", "fused"])
    args = p.parse_args()
    from trident.runtime.launch import default_backend
    cpu = default_backend() == "cpu"
    shape = TINY if args.tiny or cpu else Shape()
    if args.batch:
        shape.batch = args.batch
    world = args.world or (2 if cpu else torch.cuda.device_count())
    for r in td.launch(main, world, shape, args.sum, 5 if cpu else 100):
        print(r)
