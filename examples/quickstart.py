import torch
import trident as td


def main(ctx):                                      # runs on every rank
    w = ctx.world_size
    x = ctx.full((4096,), float(ctx.rank + 1))      # a tensor on the symmetric heap
    ctx.all_reduce(x)                               # in place: 1 + 2 + ... + w everywhere
    assert x[0].item() == w * (w + 1) / 2
    inp = torch.full((1024,), float(ctx.rank), device=ctx.device)  # plain tensors work too
    out = torch.empty(w * 1024, device=ctx.device)
    ctx.all_gather(out, inp)                        # out = [inp of rank 0, of rank 1, ...]
    g = torch.Generator().manual_seed(ctx.rank)     # each rank's own shard
    a = torch.randn(64, 32, generator=g).to(torch.bfloat16).to(ctx.device)
    weight = torch.randn(48, 32, generator=g).to(torch.bfloat16).to(ctx.device)
    y = ctx.matmul_reduce_scatter(a, weight)        # row-parallel linear: [64 / w, 48]
    ep = td.ExpertParallel(ctx, num_experts=2 * w, experts_per_token=2,
                           hidden_dim=64, max_num_tokens=16)
    tokens = torch.randn(10, 64, generator=g).to(torch.bfloat16).to(ctx.device)
    topk_idx = torch.stack([torch.randperm(2 * w, generator=g)[:2]
                            for _ in range(10)]).to(ctx.device)
    topk_weights = torch.rand(10, 2, generator=g).to(ctx.device)
    d = ep.dispatch(tokens, topk_idx)               # d.expert_x: [experts here, capacity, 64]
    combined = ep.combine(d.expert_x, d, topk_weights)  # experts = identity here
    expected = tokens.float() * topk_weights.sum(1, keepdim=True)
    torch.testing.assert_close(combined.float(), expected, rtol=2e-2, atol=2e-2)
    return tuple(y.shape), tuple(combined.shape)


if __name__ == "__main__":
    print(td.launch(main, 2))                       # 2 ranks: GPUs, or CPU processes
