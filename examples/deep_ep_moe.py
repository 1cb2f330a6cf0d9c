"""A MoE layer written against DeepEP's API, run on trident: the one line that changes is
the import.

    import deep_ep                           # DeepEP
    from trident.compat import deep_ep       # trident (one node; GPUs, or CPU ranks)

Both of DeepEP's paths: decode (low_latency_dispatch with FP8 tokens and the SM-free
receive hook, then low_latency_combine) and prefill (get_dispatch_layout, dispatch,
combine). Every rank checks its output against the same layer computed densely in torch.

    python examples/deep_ep_moe.py           # 2 ranks (GPUs, or CPU processes)
"""
import torch
import torch.nn.functional as F

import trident as td
from trident.compat import deep_ep           # was: import deep_ep

HIDDEN, FFN, EXPERTS_PER_RANK, TOPK, TOKENS = 256, 64, 2, 2, 8


def expert_weights(num_experts, device):
    """Every expert's (w_up [FFN, H], w_down [H, FFN]), the same on every rank (a seed)."""
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(FFN, HIDDEN, generator=g) / HIDDEN ** 0.5,
             torch.randn(HIDDEN, FFN, generator=g) / FFN ** 0.5) for _ in range(num_experts)]


def expert(x, w):
    """One expert on its rows (fp32 math, bf16 out)."""
    w_up, w_down = (t.to(x.device) for t in w)
    return (F.silu(x.float() @ w_up.t()) @ w_down.t()).to(torch.bfloat16)


def decode(buffer, x, topk_idx, topk_weights, weights, num_experts):
    """DeepEP's low-latency path: FP8 dispatch, receive hook, experts, combine."""
    recv, count, handle, _, hook = buffer.low_latency_dispatch(
        x, topk_idx, TOKENS, num_experts, use_fp8=True, return_recv_hook=True)
    hook()                                   # here other work could have run meanwhile
    q, scale = recv                          # [L, TOKENS * R, H] e4m3, [L, ..., H / 128]
    y = torch.zeros(q.shape, dtype=torch.bfloat16, device=q.device)
    for e, n in enumerate(count.tolist()):
        xe = q[e, :n].float() * scale[e, :n].repeat_interleave(128, dim=1)
        y[e, :n] = expert(xe, weights[buffer.rank * EXPERTS_PER_RANK + e])
    out, _, _ = buffer.low_latency_combine(y, topk_idx, topk_weights, handle)
    return out


def prefill(buffer, x, topk_idx, topk_weights, weights, num_experts):
    """DeepEP's normal path: layout, dispatch, experts (weighted here), combine."""
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, num_experts)
    recv_x, recv_idx, recv_w, counts, handle, _ = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=topk_idx, topk_weights=topk_weights)
    y = torch.zeros(recv_x.shape, dtype=torch.float32, device=x.device)
    for e in range(EXPERTS_PER_RANK):
        rows, k = (recv_idx == e).nonzero(as_tuple=True)
        out = expert(recv_x[rows], weights[buffer.rank * EXPERTS_PER_RANK + e])
        y.index_add_(0, rows, out.float() * recv_w[rows, k, None])
    combined, _, _ = buffer.combine(y.to(torch.bfloat16), handle)
    return combined


def reference(x, topk_idx, topk_weights, weights, fp8):
    """The layer computed densely on this rank's tokens."""
    if fp8:        # what the FP8 dispatch sends: e4m3 with one scale per 128 channels
        v = x.float().view(x.shape[0], -1, 128)
        amax = v.abs().amax(-1, keepdim=True).clamp_min(1e-4)
        x = ((v * (448.0 / amax)).to(torch.float8_e4m3fn).float() * (amax / 448.0)).view(x.shape)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for t in range(x.shape[0]):
        for j in range(TOPK):
            e = int(topk_idx[t, j])
            if e >= 0:
                out[t] += topk_weights[t, j] * expert(x[t:t + 1].float(), weights[e])[0].float()
    return out


def main(ctx):
    R = ctx.world_size
    num_experts = EXPERTS_PER_RANK * R
    buffer = deep_ep.Buffer(ctx.group, 0, deep_ep.Buffer.get_low_latency_rdma_size_hint(
        TOKENS, HIDDEN, R, num_experts), low_latency_mode=True,
        num_qps_per_rank=EXPERTS_PER_RANK)
    g = torch.Generator().manual_seed(1 + ctx.rank)
    x = torch.randn(TOKENS, HIDDEN, generator=g).to(torch.bfloat16).to(ctx.device)
    topk_idx = torch.rand(TOKENS, num_experts, generator=g).argsort(1)[:, :TOPK].to(ctx.device)
    topk_idx[0, 1] = -1                      # a token with one expert only
    topk_weights = torch.rand(TOKENS, TOPK, generator=g).to(ctx.device)
    weights = expert_weights(num_experts, ctx.device)
    errors = {}
    for name, path, fp8 in (("decode", decode, True), ("prefill", prefill, False)):
        out = path(buffer, x, topk_idx, topk_weights, weights, num_experts)
        ref = reference(x, topk_idx, topk_weights, weights, fp8)
        errors[name] = float((out.float() - ref).abs().max() / ref.abs().max())
        assert errors[name] < 2e-2, f"{name}: relative error {errors[name]:.3g}"
    buffer.destroy()
    return errors


if __name__ == "__main__":
    for rank, errors in enumerate(td.launch(main, 2)):
        print(f"rank {rank}: " + ", ".join(f"{k} max error {v:.2e}" for k, v in errors.items()))
