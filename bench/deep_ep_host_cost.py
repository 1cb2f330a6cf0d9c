"""Host time trident.compat.deep_ep adds to the ExpertParallel calls it wraps (issue 31:
budget 1 us per call).

Two figures per rank, per pair of calls (low_latency_dispatch + low_latency_combine,
BF16 and FP8, with and without return_recv_hook + the two hook() calls), from
interleaved rounds:

  wrapper_us  the Python of trident.compat.deep_ep alone: the Buffer's calls with every
              ExpertParallel's dispatch/combine replaced by stubs that return at once,
              minus the same stubs called as an ExpertParallel user would call them
              (valid on the CPU emulation too: no kernel runs); the fastest batch of
              50 pairs of each side, the ranks timing one at a time
  real_us     (GPUs) the real warm calls: the Buffer's pair minus ep.dispatch + ep.combine
              on the same shapes, host time only (a sync between rounds, none inside);
              median of the rounds' differences

    python bench/deep_ep_host_cost.py [world]   # GPUs (ranks share one under MPS) or CPU
"""
import json
import sys
import time

import torch

import trident as td
from trident.bench.host import _time as _batches
from trident.compat import deep_ep

ROUNDS, M, H, K, E_PER_RANK = 15, 16, 2048, 8, 4
CALLS, BATCH = 4000, 50          # stubbed pairs timed per side and repeat, per batch


class _Pending:
    """What a stubbed split-mode call returns."""
    __slots__ = ("result",)

    def __init__(self, result):
        self.result = result

    def wait(self):
        return self.result


def _stub(ep, d):
    """Make ep.dispatch/ep.combine return at once (instance attributes shadow them)."""
    def dispatch(x, topk_idx, wait=True, fp8=False):
        return d if wait else _Pending(d)

    def combine(expert_y, dd, topk_weights=None, wait=True, out=None):
        if out is None:          # as ExpertParallel.combine: it allocates y then
            out = torch.empty(dd.num_tokens, ep.hidden_dim, dtype=ep.dtype, device=ep.ctx.device)
        return out if wait else _Pending(out)
    ep.dispatch, ep.combine = dispatch, combine


def _time(calls, n: int, cuda: bool) -> float:
    """us per call of `calls()` (n calls; host time only)."""
    calls()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        calls()
    took = time.perf_counter() - start
    if cuda:
        torch.cuda.synchronize()
    return took / n * 1e6


def measure(ctx):
    cuda = ctx.backend == "cuda"
    R, dev = ctx.world_size, ctx.device
    E = E_PER_RANK * R
    buf = deep_ep.Buffer(ctx.group, 0, deep_ep.Buffer.get_low_latency_rdma_size_hint(M, H, R, E),
                         low_latency_mode=True)
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randn(M, H, generator=g).to(torch.bfloat16).to(dev)
    idx = torch.rand(M, E, generator=g).argsort(1)[:, :K].to(dev)
    w = torch.rand(M, K, generator=g).to(dev)
    rows = {}
    for use_fp8 in (False, True):
        for hook in (False, True):
            # the experts' outputs (any [L, M * R, H] bf16 tensor: values do not matter)
            y = torch.randn(E_PER_RANK, M * R, H, generator=g).to(torch.bfloat16).to(dev)

            def api():
                rx, cnt, h, ev, hk = buf.low_latency_dispatch(x, idx, M, E, use_fp8=use_fp8,
                                                              return_recv_hook=hook)
                if hook:
                    hk()
                out, ev, hk = buf.low_latency_combine(y, idx, w, h, return_recv_hook=hook)
                if hook:
                    hk()
            api()                                     # makes the ExpertParallel pair
            pair = buf._ll[(M, E)]
            ep = pair[0]
            ctx.barrier()

            def direct():
                if hook:
                    d = ep.dispatch(x, idx, wait=False, fp8=use_fp8).wait()
                    ep.combine(y, d, w, wait=False).wait()
                else:
                    d = ep.dispatch(x, idx, fp8=use_fp8)
                    ep.combine(y, d, w)
            n = 200 if cuda else 20
            real, wrap = [], ([], [])
            if cuda:
                for _ in range(ROUNDS):
                    real.append(_time(api, n, True) - _time(direct, n, True))
            # the stubs, on both ExpertParallel objects of the pair
            d = ep.dispatch(x, idx, fp8=use_fp8)
            ep.combine(y, d, w)
            for e in pair[:2]:
                _stub(e, d)
            for turn in range(R):       # one rank at a time: on a small CPU the ranks'
                if ctx.rank == turn:    # timing loops would disturb each other
                    for _ in range(3):
                        wrap[0].extend(_batches(api, CALLS, BATCH))
                        wrap[1].extend(_batches(direct, CALLS, BATCH))
                ctx.barrier()
            for e in pair[:2]:
                del e.dispatch, e.combine           # the class's methods again
            ctx.barrier()
            name = f"{'fp8' if use_fp8 else 'bf16'}{'+hook' if hook else ''}"
            # the fastest batch of each side (one that no other process interrupted)
            rows[f"wrapper_us_{name}"] = round((min(wrap[0]) - min(wrap[1])) / 1e3, 3)
            if cuda:
                rows[f"real_us_{name}"] = round(sorted(real)[ROUNDS // 2], 3)
    buf.destroy()
    return {"rank": ctx.rank, "world": R, "backend": ctx.backend,
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "per": "dispatch + combine (with +hook: and their two hook() calls)", **rows}


if __name__ == "__main__":
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    for row in td.launch(measure, world):
        print(json.dumps(row))
