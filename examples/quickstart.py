"""trident in one page: run with `python examples/quickstart.py` (GPUs, or CPU ranks)."""
import torch

import trident as td


def main(ctx):                                          # runs on every rank
    g = torch.Generator().manual_seed(ctx.rank)
    x = ctx.randn(4096, dtype=torch.bfloat16)           # on the symmetric heap
    ctx.all_reduce(x)                                   # in place; plain tensors work too
    inp = torch.randn(1024, generator=g).to(ctx.device)
    out = torch.empty(ctx.world_size * 1024, device=ctx.device)
    ctx.all_gather(out, inp)
    a = torch.randn(64, 32, generator=g).to(torch.bfloat16).to(ctx.device)
    w = torch.randn(48, 32, generator=g).to(torch.bfloat16).to(ctx.device)
    y = ctx.matmul_reduce_scatter(a, w)                 # row-parallel linear: [64 / world, 48]
    ep = td.ExpertParallel(ctx, num_experts=2 * ctx.world_size, experts_per_token=2,
                           hidden_dim=64, max_num_tokens=16)
    tokens = torch.randn(10, 64, generator=g).to(torch.bfloat16).to(ctx.device)
    topk_idx = torch.stack([torch.randperm(2 * ctx.world_size, generator=g)[:2]
                            for _ in range(10)]).to(ctx.device)
    topk_weights = torch.rand(10, 2, generator=g).to(ctx.device)
    d = ep.dispatch(tokens, topk_idx)                   # d.expert_x [L, cap, H]
    combined = ep.combine(d.expert_x, d, topk_weights)  # identity experts: sum_k w * x
    with ctx.trace(f"/tmp/trident-quickstart-{ctx.world_size}.json", print_summary=False):
        ctx.all_gather(out, inp)                        # open the file in ui.perfetto.dev
    return tuple(y.shape), tuple(combined.shape)


if __name__ == "__main__":
    print(td.launch(main, 2))
