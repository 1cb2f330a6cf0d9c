"""`trident bench moe`: MoE dispatch and combine, trident against torch.distributed.

Model shapes (experts, top-k, hidden): DeepSeek-V3 (256, 8, 7168), Qwen3-30B-A3B
(128, 8, 2048), Mixtral (8, 2, 4096); 1, 128, 256 and 4096 tokens per rank, bf16,
uniform random routing (k distinct experts per token), identity experts
(expert_y = expert_x). For each: dispatch, combine (weights given to combine, and to
dispatch: combine_wd) and dispatch + combine (total), each three ways
(common.time_modes): eager_us (calls back to back from Python), graph_us (replayed from
one CUDA graph), host_us (Python time per call), plus synced_us (one call after a device
barrier); max over ranks, for
  - trident: ExpertParallel with the default validate, as a user gets it (and the total
    once more with validate=False); from TRIDENT_MOE_HT_MIN_TOKENS (1024) tokens that is the
    high-throughput path, and `trident (low-latency)` rows time the other path there,
  - torch.distributed: counts exchange + all_to_all_single of the (token, expert) rows
    + sort / index_add on each side, no Python loops. It needs the counts on the host,
    so it cannot be captured in a CUDA graph (graph_us None),
  - the NVLink floor: the bytes that must cross NVLink, per GPU and direction (a token
    once per remote rank owning any of its experts), over the usable NVLink rate.
On the CPU emulation tiny shapes are run (marked cpu-emulation): they only show the path.
Where ranks share a GPU, the torch.distributed rows say that NCCL is not available there
(`note`); trident's rows are checked against the identity experts' result as everywhere.

--combine-ab adds rows `trident (staged combine)`: the high-throughput path with its fused
combine staging this rank's own partial sums as before the one-pass receive
(plans.HT_COMBINE_STAGED), for an A/B in one run, and leaves the low-latency rows out;
--phases keeps only some phases (e.g. dispatch,combine,combine_wd: a short run). GBps is
over the graph time, GBps_eager over the eager time. Where ranks share one GPU (MPS) the
bytes move through HBM, not NVLink: the figures compare kernels, not links.
"""
from __future__ import annotations

import os
import sys
from functools import partial

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
    from trident.ccl.nccl import host_device   # the CPU under a gloo group of GPU ranks
    everyone = torch.zeros(ctx.world_size, ctx.world_size, dtype=torch.float64,
                           device=host_device(ctx))
    everyone[ctx.rank] = out.to(everyone.device)
    dist.all_reduce(everyone, group=ctx.group)
    per_gpu = torch.maximum(everyone.sum(dim=1), everyone.sum(dim=0))
    return float(per_gpu.max()), float(everyone.sum())


PHASES = ("dispatch", "combine", "combine_wd", "total", "split", "fp8")
STAGED = "trident (staged combine)"


def _trident_rows(ctx, E, k, H, T, dtype, x, idx, w, add, check, timing, impl,
                  high_throughput, phases=PHASES, num_sms=None):
    """trident's rows of a case, on the path `high_throughput` picks (None: the default);
    impl STAGED: the high-throughput path with the staged fused combine. num_sms:
    ExpertParallel's (None: the rank's share); each row says the SMs used (`sms`)."""
    from trident.moe import ExpertParallel, plans
    plans.HT_COMBINE_STAGED = impl == STAGED       # read when the plans are built below
    ep = ExpertParallel(ctx, E, k, H, T, dtype=dtype, high_throughput=high_throughput,
                        num_sms=num_sms)
    add = partial(_with_sms, add, ep.sms)
    try:
        y = torch.empty(T, H, dtype=dtype, device=ctx.device)
        d = ep.dispatch(x, idx)
        ep.combine(d.expert_x, d, w, out=y)
        check(y)

        def both(validate=None):
            d2 = ep.dispatch(x, idx, validate=validate)
            ep.combine(d2.expert_x, d2, w, out=y)

        if "dispatch" in phases:
            add(impl, "dispatch", common.time_modes(ctx, lambda: ep.dispatch(x, idx),
                                                    **timing))
        d = ep.dispatch(x, idx)          # the latest dispatch is the one combine may use
        if "combine" in phases:
            add(impl, "combine", common.time_modes(
                ctx, lambda: ep.combine(d.expert_x, d, w, out=y), **timing))
        if "total" in phases:
            add(impl, "total", common.time_modes(ctx, both, **timing))
            add(impl, "total (validate=False)", common.time_modes(
                ctx, lambda: both(validate=False), **timing))
        check(y)
        # variant: weights sent with the tokens, combine's send half waits for nothing
        if "combine_wd" in phases:
            d = ep.dispatch(x, idx, topk_weights=w)
            add(impl, "combine_wd", common.time_modes(
                ctx, lambda: ep.combine(d.expert_x, d, out=y), **timing))
            check(y)
        if impl == "trident":
            _split_and_fp8_rows(ctx, ep, x, idx, w, y, add, check, timing, H, phases)
    finally:
        plans.HT_COMBINE_STAGED = False
        ep.close()


def _with_sms(add, sms, impl, phase, t):
    add(impl, phase, {**t, "sms": sms})


def _split_and_fp8_rows(ctx, ep, x, idx, w, y, add, check, timing, H, phases=PHASES):
    """Split mode (send halves queued, receive halves after: the SM-free receive) and
    FP8 dispatch (e4m3 + one fp32 scale per 128 channels), each checked once."""
    def split_round():
        d = ep.dispatch(x, idx, wait=False).wait()
        ep.combine(d.expert_x, d, w, wait=False, out=y).wait()

    if "split" in phases:
        split_round()
        check(y)
        add("trident", "total (split)", common.time_modes(ctx, split_round, **timing))
    if H % 128 or "fp8" not in phases:
        return
    from trident.moe import fp8
    d = ep.dispatch(x, idx, fp8=True)
    expert_y = ep.buf.expert_x                # the bf16 buffer, free in an fp8 round
    for e in range(expert_y.shape[0]):        # one expert at a time: [L, cap, H] fp32 is
        expert_y[e] = fp8.dequantize(d.expert_x[e], d.expert_x_scale[e])   # tens of GB
    ep.combine(expert_y, d, w, out=y)
    ctx.sync()
    sent = fp8.dequantize(*fp8.quantize(x))              # what the e4m3 bytes carry
    torch.testing.assert_close(y.float(), w.sum(dim=1, keepdim=True) * sent, atol=5e-2,
                               rtol=5e-2)
    add("trident", "dispatch (fp8)", common.time_modes(
        ctx, lambda: ep.dispatch(x, idx, fp8=True), **timing))


def _case(ctx, model, E, k, H, T, timing, bar, phases=PHASES, combine_ab=False,
          num_sms=None):
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

    def add(impl, phase, t):
        one = phase.startswith(("dispatch", "combine"))
        us = common.device_us(t)
        moved = (1 if one else 2) * nv_bytes
        rows.append(dict(model=model, tokens=T, impl=impl, phase=phase, **t,
                         floor_us=floor if one else 2 * floor,
                         GBps=moved / us / 1e3 if us else None,
                         GBps_eager=moved / t["eager_us"] / 1e3 if t.get("eager_us") else None))

    def check(y):
        ctx.sync()
        torch.testing.assert_close(y.float(), want, atol=5e-2, rtol=5e-2)

    # ExpertParallel(max_num_tokens=T) takes the high-throughput path from
    # ctx.options.moe_ht_min_tokens on (row `trident`); there the low-latency path is timed too
    # (rows `trident (low-latency)`) so one run compares both and tunes the threshold
    variants = [("trident", None)]
    if combine_ab:          # both high-throughput combines, one after the other
        variants = [("trident", True), (STAGED, True)]
    elif T >= ctx.options.moe_ht_min_tokens:
        variants.append(("trident (low-latency)", False))
    for impl, high_throughput in variants:
        _trident_rows(ctx, E, k, H, T, dtype, x, idx, w, add, check, timing, impl,
                      high_throughput, phases, num_sms)
    bar.step(f"{model} T={T} trident")
    if combine_ab:
        pass
    elif common.nccl_runs(ctx):
        _torch_rows(ctx, E, x, idx, w, want, add, timing)
    else:
        for phase in ("dispatch", "combine", "total"):
            add("torch.distributed", phase, common.skipped(common.NO_NCCL))
    bar.step(f"{model} T={T} torch")
    torch_eager = {r["phase"]: r["eager_us"] for r in rows if r["impl"] == "torch.distributed"}
    for r in rows:
        r["eager_vs_torch"] = common.ratio(torch_eager.get(r["phase"].split()[0]), r["eager_us"])
    if ctx.backend == "cuda":
        torch.cuda.empty_cache()
    return rows


def _torch_rows(ctx, E, x, idx, w, want, add, timing):
    """The torch.distributed baseline's rows of a case (it needs NCCL on GPUs)."""
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

    host_bound = {**timing, "graph": False}
    add("torch.distributed", "dispatch", common.time_modes(ctx, b_dispatch, **host_bound))
    ex, _, st = holder["d"]
    add("torch.distributed", "combine", common.time_modes(
        ctx, lambda: base.combine(ex, st, w), **host_bound))
    add("torch.distributed", "total", common.time_modes(ctx, b_both, **host_bound))


COLUMNS = ["model", "tokens", "impl", "phase", "sms", "eager_us", "graph_us", "host_us",
           "synced_us", "floor_us", "eager_vs_torch", "GBps", "GBps_eager"]
ABOUT = ("eager_us: calls queued back to back after a device barrier, device time per call; "
         "graph_us: the same calls replayed from one CUDA graph (None: not capturable); "
         "host_us: Python time per call while queueing; synced_us: one call right after a "
         "device barrier (median); all max over ranks. combine_wd: combine when dispatch was "
         "given the weights; floor_us: NVLink bytes one GPU must send or receive (per op; "
         "twice that for total) over the usable rate; sms: the SMs trident's launches are "
         "sized for (two programs each; ExpertParallel's num_sms); GBps: those bytes over "
         "the graph time (eager where none), GBps_eager over the eager time; "
         "eager_vs_torch = torch.distributed eager time / eager time")


def _bench_rank(ctx, models, tokens, timing, out_dir, phases=PHASES, combine_ab=False,
                num_sms=None):
    todo = [(m, t) for m in models for t in tokens]
    bar = common.Progress(2 * len(todo), "moe", enabled=ctx.rank == 0)
    rows = []
    for model, T in todo:
        E, k, H = models[model]
        rows += _case(ctx, model, E, k, H, T, timing, bar, phases, combine_ab, num_sms)
    path = common.write_results(ctx, "moe", rows, {"columns": ABOUT, "models": models},
                                out_dir=out_dir)
    png = None
    if ctx.rank == 0:
        series = {}
        for r in rows:
            if r["phase"] == "total":
                for mode in ("eager", "graph"):
                    if r[f"{mode}_us"]:
                        series.setdefault(f"{r['model']} {r['impl']} {mode}", []).append(
                            (r["tokens"], r[f"{mode}_us"]))
                if r["impl"] == "trident":
                    series.setdefault(f"{r['model']} NVLink floor", []).append(
                        (r["tokens"], max(r["floor_us"], 1e-3)))
        png = common.plot(os.path.splitext(path)[0] + ".png", series, "tokens per rank",
                          "dispatch + combine (us)", f"MoE dispatch + combine, "
                          f"{common.device_kind(ctx)}", logx=True,
                          logy=True) if series else None    # none: --phases without total
    head = common.headline(ctx)
    if common.shares_gpu(ctx):
        head += "\nGBps: ranks share one GPU (MPS): HBM, not NVLink"
    return rows, path, png, head


def main(argv=None) -> int:
    parser = common.suite_parser("trident bench moe", __doc__)
    parser.add_argument("--models", default=None,
                        help=f"comma-separated, from {', '.join(MODELS)} (default: all)")
    parser.add_argument("--tokens", default=None, help="comma-separated tokens per rank "
                        f"(default {GPU_TOKENS} on GPUs, {CPU_TOKENS} on the CPU emulation)")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated subset of {','.join(PHASES)} (default: all)")
    parser.add_argument("--combine-ab", action="store_true",
                        help="time the high-throughput path with the one-pass combine and "
                        "with the staged combine it replaced (rows 'trident' and "
                        f"'{STAGED}'); no low-latency or torch.distributed rows")
    parser.add_argument("--num-sms", type=int, default=None,
                        help="ExpertParallel's num_sms: the SMs trident's kernels are sized "
                        "for (default: each rank's share of its GPU); column sms")
    args = parser.parse_args(argv)
    phases = tuple(common.parse_ops(parser, args.phases, list(PHASES)))
    from trident.runtime.launch import default_backend, launch
    from trident.moe import ExpertParallel
    backend = args.backend or default_backend()
    gpu = backend == "cuda"
    world = args.world_size or common.default_world(backend, cpu=4)
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
    heap = max(ExpertParallel.heap_bytes(world, k, H, max(tokens)) for E, k, H in models.values())
    heap = heap + (256 << 20) if gpu else 64 << 20
    # --combine-ab: two ExpertParallels one after the other; the first one's heap is freed
    results = launch(_bench_rank, world, models, tokens, common.timing_options(args, gpu, iters=10),
                     args.out_dir, phases, args.combine_ab, args.num_sms, backend=backend,
                     heap_size=heap)
    rows, path, png, headline = results[0]
    if headline:
        print(headline)
    common.print_table(rows, COLUMNS)
    print(f"results: {path}" + (f"\nplot: {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
