"""A MoE layer on trident's expert-parallel dispatch/combine, checked against one process
and timed against the same layer on torch.distributed.all_to_all_single.

    python examples/moe_layer.py                   # GPUs: every GPU; H 7168, expert FFN 2048,
                                                   # 8 experts per rank, top-8; 128 and 4096
                                                   # tokens per rank
    python examples/moe_layer.py --world-size 2    # the CPU emulation: tiny sizes
    python examples/moe_layer.py --fp8             # fp8 dispatch (dequantised before the GEMM)

The layer, per rank: router (x @ router.T in fp32, softmax, top-k, weights renormalised)
-> ep.dispatch -> each local expert's SwiGLU MLP (down(silu(gate(x)) * up(x))) over
d.expert_x, rows [0, expert_num_tokens[e]) of expert e -> ep.combine with the router
weights. The expert MLPs are a grouped GEMM:
  - "grouped" (default where torch has torch._grouped_mm: sm_90 GPUs, and the CPU
    fallback of recent torch): the valid rows of expert_x are packed on the device into
    one [rows, H] tensor (its size is the worst case, world * T * min(k, L) rows, so no
    host synchronisation), torch._grouped_mm runs gate/up and down with offsets
    cumsum(expert_num_tokens), and the rows go back to expert_y's [L, cap, H] layout.
    CUDA-graph capturable.
  - "loop": expert_num_tokens read on the host, then one torch matmul per expert (a
    host synchronisation per layer: no CUDA graph).
The baseline ("all_to_all_single") is the textbook layer: each (token, expert) pair is
sent to the expert's rank (no deduplication per rank), with splits exchanged first and read
on the host (so it is eager only), experts sorted and run with the same grouped GEMM, sent
back, weighted and summed.

Every rank checks its output against a dense fp32 reference of the same layer (all
experts on all of its tokens, the router's top-k weights as masks) on the same random
weights; in the check, rank 0 has no tokens. With --fp8 the reference's experts see the
sender-side quantise->dequantise of x (trident.moe.fp8), as the layer's do.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

import trident as td
from trident.moe import fp8 as tfp8


@dataclass
class Shape:
    hidden: int = 7168
    ffn: int = 2048            # each expert's intermediate size (DeepSeek-V3's)
    experts_per_rank: int = 8
    top_k: int = 8


TINY = Shape(hidden=128, ffn=64, experts_per_rank=2, top_k=2)


# ---------------------------------------------------------------------------- weights
def router_weights(s: Shape, E: int, device) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(7)
    return torch.randn(E, s.hidden, generator=g, device=device)


def expert_weights(s: Shape, e: int, device, dtype=torch.bfloat16):
    """Expert e's (w_gate_up [2F, H], w_down [H, F]), the same on every rank."""
    g = torch.Generator(device=device).manual_seed(1000 + e)
    w_gu = torch.randn(2 * s.ffn, s.hidden, generator=g, device=device) * s.hidden ** -0.5
    w_down = torch.randn(s.hidden, s.ffn, generator=g, device=device) * s.ffn ** -0.5
    return w_gu.to(dtype), w_down.to(dtype)


def route(x: torch.Tensor, router: torch.Tensor, k: int):
    """(topk_weights [T, k] fp32, topk_idx [T, k] int64): softmax over the router logits,
    the k largest, renormalised to sum to 1."""
    probs = torch.softmax(x.float() @ router.t(), dim=-1)
    w, idx = probs.topk(k, dim=-1)
    return w / w.sum(-1, keepdim=True), idx


def has_grouped_mm(device) -> bool:
    if not hasattr(torch, "_grouped_mm"):
        return False
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (9, 0)
    return True


# ---------------------------------------------------------------------------- experts
def swiglu(h: torch.Tensor) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def grouped_mlp(a: torch.Tensor, ends: torch.Tensor, w_gu: torch.Tensor,
                w_down: torch.Tensor) -> torch.Tensor:
    """Packed rows a [R, H] whose expert e owns rows [ends[e-1], ends[e]) (int32 ends on
    the device); rows past ends[-1] are not computed (their output is garbage)."""
    h = torch._grouped_mm(a, w_gu.transpose(1, 2), offs=ends)
    return torch._grouped_mm(swiglu(h), w_down.transpose(1, 2), offs=ends)


def experts_grouped(d, w_gu, w_down, rows_max: int) -> torch.Tensor:
    """expert_y [L, cap, H] from d (a Dispatched) with torch._grouped_mm, no host sync."""
    L, cap, H = d.expert_x.shape
    dev = d.expert_x.device
    counts = d.expert_num_tokens
    ends = torch.cumsum(counts, 0, dtype=torch.int32)
    p = torch.arange(rows_max, device=dev, dtype=torch.int32)
    e = torch.searchsorted(ends, p, right=True)              # L for rows past the last
    valid = e < L
    ec = e.clamp(max=L - 1)
    row = ec * cap + (p - (ends - counts)[ec])
    read = torch.where(valid, row, 0)
    a = d.expert_x.reshape(L * cap, H).index_select(0, read)
    if d.expert_x_scale is not None:                        # fp8 dispatch: dequantise
        s = d.expert_x_scale.reshape(L * cap, -1).index_select(0, read)
        a = tfp8.dequantize(a, s).to(w_gu.dtype)
    y = grouped_mlp(a, ends, w_gu, w_down)
    out = torch.empty(L * cap + 1, H, dtype=y.dtype, device=dev)  # + a row for the rest
    out.index_copy_(0, torch.where(valid, row, L * cap).long(), y)
    return out[:L * cap].view(L, cap, H)


def experts_loop(d, w_gu, w_down) -> torch.Tensor:
    """expert_y [L, cap, H] with one matmul chain per expert (reads the counts on the host)."""
    L, cap, H = d.expert_x.shape
    ey = torch.empty(L, cap, H, dtype=w_gu.dtype, device=d.expert_x.device)
    for e, n in enumerate(d.expert_num_tokens.tolist()):
        if n:
            x = d.expert_x[e, :n]
            if d.expert_x_scale is not None:
                x = tfp8.dequantize(x, d.expert_x_scale[e, :n]).to(w_gu.dtype)
            ey[e, :n] = swiglu(x @ w_gu[e].t()) @ w_down[e].t()
    return ey


# ---------------------------------------------------------------------------- layers
class Weights:
    """This rank's experts (stacked) and the router."""

    def __init__(self, ctx, s: Shape):
        L = s.experts_per_rank
        self.E = L * ctx.world_size
        self.router = router_weights(s, self.E, ctx.device)
        ws = [expert_weights(s, ctx.rank * L + i, ctx.device) for i in range(L)]
        self.w_gu = torch.stack([w[0] for w in ws])           # [L, 2F, H]
        self.w_down = torch.stack([w[1] for w in ws])         # [L, H, F]


class TridentMoE:
    """The layer on td.ExpertParallel; T <= max_tokens tokens per call."""

    def __init__(self, ctx, s: Shape, w: Weights, max_tokens: int, gemm: str, fp8: bool):
        self.s, self.w, self.gemm, self.fp8 = s, w, gemm, fp8
        self.ep = td.ExpertParallel(ctx, w.E, s.top_k, s.hidden, max_tokens)
        L = s.experts_per_rank
        self.rows_max = min(ctx.world_size * max_tokens * min(s.top_k, L), L * self.ep.capacity)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        topk_w, topk_idx = route(x, self.w.router, self.s.top_k)
        d = self.ep.dispatch(x, topk_idx, fp8=self.fp8)
        if self.gemm == "grouped":
            ey = experts_grouped(d, self.w.w_gu, self.w.w_down, self.rows_max)
        else:
            ey = experts_loop(d, self.w.w_gu, self.w.w_down)
        return self.ep.combine(ey, d, topk_w)

    def close(self):
        self.ep.close()


class AllToAllMoE:
    """The same layer on torch.distributed.all_to_all_single (one row per (token, expert))."""

    def __init__(self, ctx, s: Shape, w: Weights, gemm: str):
        self.ctx, self.s, self.w, self.gemm = ctx, s, w, gemm

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        s, w, world = self.s, self.w, self.ctx.world_size
        L, k, (T, H) = s.experts_per_rank, s.top_k, x.shape
        topk_w, topk_idx = route(x, w.router, k)
        dest = (topk_idx // L).flatten()
        order = torch.argsort(dest, stable=True)
        send_x = x[order // k]
        send_e = (topk_idx.flatten() % L)[order]
        send_n = torch.bincount(dest, minlength=world)
        recv_n = torch.empty_like(send_n)
        dist.all_to_all_single(recv_n, send_n)
        sn, rn = send_n.tolist(), recv_n.tolist()              # the host needs the splits
        recv_x = x.new_empty(sum(rn), H)
        dist.all_to_all_single(recv_x, send_x, rn, sn)
        recv_e = send_e.new_empty(sum(rn))
        dist.all_to_all_single(recv_e, send_e, rn, sn)
        by_expert = torch.argsort(recv_e, stable=True)
        xs = recv_x[by_expert]
        counts = torch.bincount(recv_e, minlength=L)
        if self.gemm == "grouped":
            ys = grouped_mlp(xs, torch.cumsum(counts, 0, dtype=torch.int32), w.w_gu, w.w_down)
        else:
            ys, start = torch.empty_like(xs), 0
            for e, n in enumerate(counts.tolist()):
                ys[start:start + n] = swiglu(xs[start:start + n] @ w.w_gu[e].t()) @ w.w_down[e].t()
                start += n
        recv_y = torch.empty_like(ys)
        recv_y[by_expert] = ys
        back = x.new_empty(T * k, H)
        dist.all_to_all_single(back, recv_y, sn, rn)
        pair_y = torch.empty_like(back)
        pair_y[order] = back
        return (pair_y.view(T, k, H).float() * topk_w[..., None]).sum(1).to(x.dtype)

    def close(self):
        pass


def reference(x: torch.Tensor, s: Shape, E: int, router: torch.Tensor, fp8: bool):
    """The dense layer in fp32 in one process: every expert on every token, weighted by
    the router's top-k weights (zero for the experts a token did not pick)."""
    topk_w, topk_idx = route(x, router, s.top_k)
    xe = tfp8.dequantize(*tfp8.quantize(x)) if fp8 else x.float()
    y = torch.zeros(x.shape[0], s.hidden, device=x.device)
    for e in range(E):
        w_gu, w_down = (w.float() for w in expert_weights(s, e, x.device))
        coef = (topk_w * (topk_idx == e)).sum(-1)
        y += coef[:, None] * (swiglu(xe @ w_gu.t()) @ w_down.t())
    return y


# ---------------------------------------------------------------------------- main
def tokens_of(ctx, s: Shape, T: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device=ctx.device).manual_seed(seed * 131 + ctx.rank)
    return torch.randn(T, s.hidden, generator=g, device=ctx.device).to(torch.bfloat16)


def layers(ctx, s: Shape, w: Weights, max_tokens: int, gemm: str, fp8: bool):
    """(name, layer) pairs: trident's, then the all_to_all_single baseline where NCCL can
    run (not where ranks share a GPU: the host group is gloo there)."""
    yield "trident", TridentMoE(ctx, s, w, max_tokens, gemm, fp8)
    if ctx.nccl_available:
        yield "all_to_all_single", AllToAllMoE(ctx, s, w, gemm)


def check(ctx, s: Shape, w: Weights, max_tokens: int, gemm: str, fp8: bool) -> dict:
    """Both layers against the dense reference; rank 0 has no tokens, the others 1..M."""
    g = torch.Generator().manual_seed(5 + ctx.rank)
    T = 0 if ctx.rank == 0 else int(torch.randint(1, max_tokens + 1, (1,), generator=g))
    x = tokens_of(ctx, s, T, 1)
    errs = {}
    for name, layer in layers(ctx, s, w, max_tokens, gemm, fp8):
        ref = reference(x, s, w.E, w.router, fp8 and name == "trident")   # baseline: bf16
        y = layer(x)
        scale = max(ref.abs().max().item(), 1e-6) if T else 1.0
        errs[name] = (y.float() - ref).abs().max().item() / scale if T else 0.0
        assert y.shape == (T, s.hidden), (name, y.shape)
        layer.close()
    ctx.sync()
    return dict(T=T, rel_err=errs)


def bench(ctx, s: Shape, w: Weights, T: int, gemm: str, fp8: bool) -> list[dict]:
    from trident.bench.common import time_modes
    x = tokens_of(ctx, s, T, 2)
    rows = []
    for name, layer in layers(ctx, s, w, T, gemm, fp8):
        gpu_graph = ctx.backend == "cuda" and name == "trident" and gemm == "grouped"
        opts = {} if ctx.backend == "cuda" else dict(calls=2, reps=1, warmup=1)
        t = time_modes(ctx, lambda: layer(x), graph=gpu_graph, **opts)
        rows.append(dict(layer=name, tokens=T, eager_us=t["eager_us"], graph_us=t["graph_us"],
                         graph_note=None if t["graph_us"] else t["graph_note"]))
        layer.close()
    return rows


def main(ctx, s: Shape = TINY, tokens=(4,), gemm: str | None = None, fp8: bool = False,
         timing: bool = True, check_tokens: int | None = None) -> dict:
    """Check both layers against the reference (at most check_tokens tokens per rank,
    default min(64, max(tokens))), then time them at each T in `tokens`."""
    gemm = gemm or ("grouped" if has_grouped_mm(ctx.device) else "loop")
    w = Weights(ctx, s)
    result = dict(rank=ctx.rank, gemm=gemm, fp8=fp8,
                  check=check(ctx, s, w, check_tokens or min(64, max(tokens)), gemm, fp8))
    if timing:
        result["times"] = [r for T in tokens for r in bench(ctx, s, w, T, gemm, fp8)]
    ctx.barrier()
    return result


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks (default: every GPU, or 2 CPU ranks)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes (default on the CPU emulation)")
    p.add_argument("--tokens", default=None, help="tokens per rank to time, e.g. 128,4096")
    p.add_argument("--gemm", choices=["grouped", "loop"], default=None,
                   help="expert GEMM (default: grouped where torch._grouped_mm runs)")
    p.add_argument("--fp8", action="store_true", help="fp8 dispatch")
    args = p.parse_args()
    from trident.runtime.launch import default_backend
    cpu = default_backend() == "cpu"
    shape = TINY if args.tiny or cpu else Shape()
    tokens = [int(t) for t in (args.tokens or ("4" if cpu else "128,4096")).split(",")]
    world = args.world_size or (2 if cpu else torch.cuda.device_count())
    heap = td.ExpertParallel.heap_bytes(world, shape.top_k, shape.hidden, max(tokens)) + (64 << 20)
    results = td.launch(main, world, shape, tokens, args.gemm, args.fp8,
                        heap_size=max(heap, 256 << 20))
    r0 = results[0]
    print(f"world {world}, {shape}, expert GEMM: {r0['gemm']}, fp8 dispatch: {r0['fp8']}")
    for r in results:
        print(f"  rank {r['rank']}: {r['check']['T']} tokens, max error / max |ref|: "
              + ", ".join(f"{k} {v:.2e}" for k, v in r["check"]["rel_err"].items()))
    print("time per layer call (max over ranks; eager = calls queued back to back, graph = "
          "replayed from one CUDA graph):")
    for t in r0.get("times", []):
        g = f"{t['graph_us']:.1f} us" if t["graph_us"] else f"- ({t['graph_note']})"
        print(f"  {t['layer']:>18} T={t['tokens']:<5} eager {t['eager_us']:.1f} us, graph {g}")
