"""Lamport all-reduce under stress: many rounds back to back whose sizes, dtypes and grids
change every call, checked every --check-every calls; on a failure each rank prints its
protocol state (round counter, programs counted, heads left nonzero, words of the buffers
that are not the sentinel), so a broken round can be told from a late store.

    PYTHONPATH=. python -m bench.lab.lamport_stress --world 4 --rounds 2000
    PYTHONPATH=. python -m bench.lab.lamport_stress --world 2 --rounds 50 --backend cpu
"""
from __future__ import annotations

import argparse
import sys

import torch

import trident as td

SHAPES = [(37, torch.float32, 16, 3), (1000, torch.bfloat16, 64, 8), (5, torch.float16, 4, 2),
          (256, torch.float32, 256, 1), (129, torch.bfloat16, 32, 5), (4099, torch.bfloat16, None, None),
          (300, torch.float32, None, None), (17, torch.bfloat16, None, 1)]


def _state(ctx) -> str:
    from trident.ccl import common, lamport
    ws = lamport.workspace(ctx)
    words = ws.data.view(torch.int32)
    per = words.numel() // 3
    dirty = [int((words[b * per:(b + 1) * per] != lamport.FILL32).sum()) for b in range(3)]
    heads = ws.heads.view(3, ctx.world_size, -1)
    live = [(b, s, p) for b, s, p in (heads != 0).nonzero().tolist()][:8]
    return (f"rank {ctx.rank}: round {int(ws.sync[0])}, counted {int(ws.sync[1])}, flag epoch "
            f"{int(common.state(ctx).sync[0])}, words not sentinel per buffer {dirty}, "
            f"heads left (buffer, src, program) {live}")


def _round(ctx, i, shapes, flag_every, pending, algorithm="lamport"):
    w, r = ctx.world_size, ctx.rank
    n, dtype, block, programs = shapes[i % len(shapes)]
    g = torch.Generator().manual_seed(i)
    xs = [torch.randint(-8, 8, (n,), generator=g).to(dtype) for _ in range(w)]
    want = sum(x.float() for x in xs).to(dtype)
    t = xs[r].clone().to(ctx.device)
    ctx.all_reduce(t, algorithm=algorithm, block=block, programs=programs)
    pending.append((i, t, want))
    if flag_every and i % flag_every == flag_every - 1:
        ctx.all_reduce(torch.ones(64, device=ctx.device), algorithm="one_shot")


def main(ctx, rounds: int, check_every: int, flag_every: int, shapes: str = "all",
         algorithm: str = "lamport"):
    shapes = {"all": SHAPES, "auto": [s for s in SHAPES if s[2] is None and s[3] is None],
              "one": SHAPES[:1]}[shapes]
    pending = []
    for i in range(rounds):
        try:
            _round(ctx, i, shapes, flag_every, pending, algorithm)
            if len(pending) >= check_every or i == rounds - 1:
                ctx.sync()
                for j, got, want in pending:
                    if not torch.equal(got.cpu(), want):
                        bad = (got.cpu() != want).nonzero().flatten()[:5].tolist()
                        raise AssertionError(f"round {j}: wrong elements {bad}")
                pending = []
        except Exception as exc:
            torch.cuda.synchronize() if ctx.backend == "cuda" else None
            print(f"FAILED at call {i}: {type(exc).__name__}: {str(exc)[:300]}\n  {_state(ctx)}",
                  file=sys.stderr, flush=True)
            return f"rank {ctx.rank}: FAILED at call {i}: {_state(ctx)}"
    return _state(ctx)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--check-every", type=int, default=50)
    p.add_argument("--flag-every", type=int, default=7, help="a one_shot call every this many (0: none)")
    p.add_argument("--shapes", default="all", choices=("all", "auto", "one"),
                   help="all: grids change every call; auto: default grids; one: one shape")
    p.add_argument("--algorithm", default="lamport", help="a control: the same rounds by another algorithm")
    p.add_argument("--backend", default=None)
    a = p.parse_args()
    for line in td.launch(main, a.world, a.rounds, a.check_every, a.flag_every, a.shapes, a.algorithm,
                          backend=a.backend, timeout=10.0):
        print(line)
