"""`trident bench moe`: MoE dispatch and combine, trident against torch.distributed.

Model shapes (experts, top-k, hidden): DeepSeek-V3 (256, 8, 7168), Qwen3-30B-A3B
(128, 8, 2048), Mixtral (8, 2, 4096); 1, 128, 256 and 4096 tokens per rank, bf16,
uniform random routing (k distinct experts per token), identity experts
(expert_y = expert_x). For each: dispatch, combine and dispatch + combine, median over
repetitions, max over ranks, for
  - trident: ExpertParallel (validate=False: no host synchronisation),
  - torch.distributed: counts exchange + all_to_all_single of the (token, expert) rows
    + sort / index_add on each side, no Python loops (it needs the counts on the host),
  - the NVLink floor: the bytes that must cross NVLink, per GPU and direction (a token
    once per remote rank owning any of its experts), over the usable NVLink rate.
On the CPU emulation tiny shapes are run (marked cpu-emulation): they only show the path.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

from trident.bench import common

MODELS = {                      # experts, top-k, hidden
    "deepseek-v3": (256, 8, 7168),
    "qwen3-30b-a3b": (128, 8, 2048),
    "mixtral": (8, 2, 4096),
}
GPU_TOKENS = [1, 128, 256, 4096]
CPU_TOKENS = [1, 4]


def _cpu_models(world: int) -> dict:
    return {"tiny-top2": (2 * world, 2, 64), "tiny-top1": (world, 1, 96)}


class TorchBaseline:
    """Dispatch/combine with torch.distributed collectives: one row per (token, expert)."""

    def __init__(self, ctx, num_experts: int):
        self.group, self.rank, self.world = ctx.group, ctx.rank, ctx.world_size
        self.L = num_experts // ctx.world_size
        self.device = ctx.device

    def dispatch(self, x, topk_idx):
        T, k = topk_idx.shape
        flat = topk_idx.reshape(-1)
        order = flat.argsort(stable=True)              # by expert, hence by rank
        experts = flat[order]
        send = torch.bincount(experts // self.L, minlength=self.world)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        send_splits, recv_splits = send.tolist(), recv.tolist()
        n = sum(recv_splits)
        recv_x = x.new_empty(n, x.shape[1])
        dist.all_to_all_single(recv_x, x[order // k], recv_splits, send_splits, group=self.group)
        recv_e = experts.new_empty(n)
        dist.all_to_all_single(recv_e, experts, recv_splits, send_splits, group=self.group)
        local = recv_e - self.rank * self.L
        order2 = local.argsort(stable=True)
        expert_x = recv_x[order2]                      # grouped by local expert
        expert_num_tokens = torch.bincount(local, minlength=self.L)
        return expert_x, expert_num_tokens, (T, order, order2, send_splits, recv_splits)

    def combine(self, expert_y, state, topk_weights):
        T, order, order2, send_splits, recv_splits = state
        back = torch.empty_like(expert_y)
        back[order2] = expert_y
        ret = expert_y.new_empty(sum(send_splits), expert_y.shape[1])
        dist.all_to_all_single(ret, back, send_splits, recv_splits, group=self.group)
        k = topk_weights.shape[1]
        w = topk_weights.reshape(-1)[order]
        out = torch.zeros(T, expert_y.shape[1], dtype=torch.float32, device=expert_y.device)
        out.index_add_(0, order // k, ret.float() * w[:, None])
        return out.to(expert_y.dtype)


def _routing(T, E, k, device, g):
    return torch.rand(T, E, generator=g).argsort(dim=1)[:, :k].to(device)


def _nvlink_bytes(ctx, idx, L, H, esize) -> tuple[float, float]:
    """(max over ranks of bytes one GPU must send or receive over NVLink, sum over ranks)."""
    ranks = idx // L
    hit = torch.zeros(idx.shape[0], ctx.world_size, dtype=torch.bool, device=idx.device)
    hit.scatter_(1, ranks, True)
    hit[:, ctx.rank] = False
    out = hit.sum(dim=0).to(torch.float64) * H * esize       # bytes to each peer
    everyone = torch.zeros(ctx.world_size, ctx.world_size, dtype=torch.float64, device=ctx.device)
    everyone[ctx.rank] = out
    dist.all_reduce(everyone, group=ctx.group)
    per_gpu = torch.maximum(everyone.sum(dim=1), everyone.sum(dim=0))
    return float(per_gpu.max()), float(everyone.sum())


def _case(ctx, model, E, k, H, T, iters, bar):
    import trident as td
    dtype = torch.bfloat16
    g = torch.Generator().manual_seed(1000 + ctx.rank)
    x = torch.randn(T, H, generator=g).to(dtype).to(ctx.device)
    idx = _routing(T, E, k, ctx.device, g)
    w = torch.rand(T, k, generator=g).to(ctx.device)
    want = (w.sum(dim=1, keepdim=True) * x.float())             # identity experts
    L = E // ctx.world_size
    nv_bytes, _ = _nvlink_bytes(ctx, idx, L, H, 2)
    floor = common.nvlink_floor_us(nv_bytes)
    rows = []

    ep = td.ExpertParallel(ctx, E, k, H, T, dtype=dtype, validate=False)
    try:
        y = torch.empty(T, H, dtype=dtype, device=ctx.device)
        d = ep.dispatch(x, idx, validate=True)
        ep.combine(d.expert_x, d, w, out=y)
        ctx.sync()
        torch.testing.assert_close(y.float(), want, atol=5e-2, rtol=5e-2)

        def both():
            d2 = ep.dispatch(x, idx)
            ep.combine(d2.expert_x, d2, w, out=y)

        t_d = common.time_us(ctx, lambda: ep.dispatch(x, idx), iters=iters)
        d = ep.dispatch(x, idx)          # the latest dispatch is the one combine may use
        t_c = common.time_us(ctx, lambda: ep.combine(d.expert_x, d, w, out=y), iters=iters)
        t_t = common.time_us(ctx, both, iters=iters)
        ctx.sync()
        torch.testing.assert_close(y.float(), want, atol=5e-2, rtol=5e-2)
        # variant: weights sent with the tokens, combine's send half waits for nothing
        d = ep.dispatch(x, idx, topk_weights=w)
        t_cw = common.time_us(ctx, lambda: ep.combine(d.expert_x, d, out=y), iters=iters)
        ctx.sync()
        torch.testing.assert_close(y.float(), want, atol=5e-2, rtol=5e-2)
    finally:
        ep.close()
    bar.step(f"{model} T={T} trident")
    rows.append(dict(model=model, tokens=T, impl="trident", dispatch_us=t_d, combine_us=t_c,
                     combine_wd_us=t_cw, total_us=t_t, floor_us=floor, total_floor_us=2 * floor,
                     GBps=2 * nv_bytes / t_t / 1e3 if t_t else None))

    base = TorchBaseline(ctx, E)
    ex, _, st = base.dispatch(x, idx)
    yb = base.combine(ex, st, w)
    torch.testing.assert_close(yb.float(), want, atol=5e-2, rtol=5e-2)
    holder = {}

    def b_dispatch():
        holder["d"] = base.dispatch(x, idx)

    def b_both():
        ex2, _, st2 = base.dispatch(x, idx)
        base.combine(ex2, st2, w)

    b_d = common.time_us(ctx, b_dispatch, iters=iters)
    ex, _, st = holder["d"]
    b_c = common.time_us(ctx, lambda: base.combine(ex, st, w), iters=iters)
    b_t = common.time_us(ctx, b_both, iters=iters)
    del ex, st, holder
    bar.step(f"{model} T={T} torch")
    rows.append(dict(model=model, tokens=T, impl="torch.distributed", dispatch_us=b_d,
                     combine_us=b_c, total_us=b_t, floor_us=floor, total_floor_us=2 * floor,
                     GBps=2 * nv_bytes / b_t / 1e3 if b_t else None))
    rows[0]["speedup_vs_torch"] = b_t / t_t if t_t else None
    if ctx.backend == "cuda":
        torch.cuda.empty_cache()
    return rows


def _bench_rank(ctx, models, tokens, iters, out_dir):
    todo = [(m, t) for m in models for t in tokens]
    bar = common.Progress(2 * len(todo), "moe", enabled=ctx.rank == 0)
    rows = []
    for model, T in todo:
        E, k, H = models[model]
        rows += _case(ctx, model, E, k, H, T, iters, bar)
    if ctx.backend != "cuda":
        for r in rows:
            r["note"] = "cpu-emulation"
    path = common.write_results(ctx, "moe", rows, {
        "note": "us: median over repetitions, max over ranks; combine_wd_us: combine when "
                "dispatch was given the weights; floor_us: NVLink bytes one GPU "
                "must send or receive in one op over the usable rate; GBps: both ops' NVLink "
                "bytes over total_us", "models": models}, out_dir=out_dir)
    png = None
    if ctx.rank == 0:
        series = {}
        for r in rows:
            series.setdefault(f"{r['model']} {r['impl']}", []).append((r["tokens"], r["total_us"]))
            if r["impl"] == "trident":
                series.setdefault(f"{r['model']} NVLink floor", []).append(
                    (r["tokens"], max(r["total_floor_us"], 1e-3)))
        png = common.plot(os.path.splitext(path)[0] + ".png", series, "tokens per rank",
                          "dispatch + combine (us)", f"MoE dispatch + combine, "
                          f"{common.device_kind(ctx)}", logx=True, logy=True)
    return rows, path, png


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="trident bench moe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=None,
                        help=f"comma-separated, from {', '.join(MODELS)} (default: all)")
    parser.add_argument("--tokens", default=None, help="comma-separated tokens per rank "
                        f"(default {GPU_TOKENS} on GPUs, {CPU_TOKENS} on the CPU emulation)")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--world-size", type=int, default=None)
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args(argv)
    from trident.launch import default_backend, default_world_size, launch
    from trident.moe import ExpertParallel
    gpu = default_backend() == "cuda"
    world = args.world_size or default_world_size(default_backend())
    if gpu:
        names = args.models.split(",") if args.models else list(MODELS)
        unknown = [n for n in names if n not in MODELS]
        if unknown:
            parser.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
        models = {n: MODELS[n] for n in names}
    else:
        models = _cpu_models(world)
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else \
        (GPU_TOKENS if gpu else CPU_TOKENS)
    iters = args.iters or (20 if gpu else 3)
    heap = max(ExpertParallel.heap_bytes(world, k, H, max(tokens)) for E, k, H in models.values())
    heap = heap + (256 << 20) if gpu else 64 << 20
    results = launch(_bench_rank, world, models, tokens, iters, args.out_dir, heap_size=heap)
    rows, path, png = results[0]
    common.print_table(rows, ["model", "tokens", "impl", "dispatch_us", "combine_us",
                              "combine_wd_us", "total_us",
                              "floor_us", "total_floor_us", "GBps", "speedup_vs_torch"])
    print(f"results: {path}" + (f"\nplot: {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
