"""`trident trace OP [options]`: run one op on every rank with tracing on and write one
Perfetto trace (plus the summary table).

    trident trace all_gather --size 1048576 -o ag.json     # all visible GPUs (or 4 CPU ranks)
    trident trace moe --tokens 128 --hidden 2048
    trident trace ring                                     # built-in demo, always there

Ops of packages that are not built yet are listed as unavailable, with the reason.
On GPUs the op first runs untraced and traced outside the recorded session, so neither
compilation shows up in the timeline.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

OPS = {
    "ring": "ring exchange of --size elements (trident.tools.ring, built in)",
    "all_gather": "ctx.all_gather(out [world*size], inp [size])",
    "reduce_scatter": "ctx.reduce_scatter(out [size], inp [world*size])",
    "all_reduce": "ctx.all_reduce(t [size])",
    "moe": "ExpertParallel dispatch + combine (identity experts)",
}


def unavailable(op: str) -> str | None:
    """Why `op` cannot run in this checkout, or None if it can."""
    if op in ("all_gather", "reduce_scatter", "all_reduce"):
        ccl = importlib.import_module("trident.ccl")
        if not hasattr(ccl, op):
            return f"trident.ccl has no {op} yet"
    if op == "moe":
        try:
            from ..moe import ExpertParallel  # noqa: F401
        except ImportError as exc:
            return f"trident.moe.ExpertParallel is not importable ({exc})"
    return None


def _op_call(ctx, op: str, opts: dict):
    """A no-argument function that runs `op` once on its inputs (made here, on random data)."""
    import torch
    dtype = getattr(torch, opts["dtype"] or ("bfloat16" if ctx.backend == "cuda" else "float32"))
    gen = torch.Generator(device="cpu").manual_seed(1234 + ctx.rank)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=ctx.device, dtype=dtype)
    n, w = opts["size"], ctx.world_size
    if op == "ring":
        from .ring import ring_exchange
        inp, out = rand(n), torch.empty(n, dtype=dtype, device=ctx.device)
        return lambda: ring_exchange(ctx, out, inp)
    if op == "all_gather":
        inp, out = rand(n), torch.empty(w * n, dtype=dtype, device=ctx.device)
        return lambda: ctx.all_gather(out, inp)
    if op == "reduce_scatter":
        inp, out = rand(w * n), torch.empty(n, dtype=dtype, device=ctx.device)
        return lambda: ctx.reduce_scatter(out, inp)
    if op == "all_reduce":
        t = rand(n)
        return lambda: ctx.all_reduce(t)
    if op == "moe":
        from ..moe import ExpertParallel
        experts, k, tokens, hidden = opts["experts"] or 2 * w, opts["topk"], opts["tokens"], \
            opts["hidden"]
        ep = ExpertParallel(ctx, experts, k, hidden, tokens, dtype=dtype)
        x = rand(tokens, hidden)
        topk_idx = torch.rand(tokens, experts, generator=gen).topk(k, dim=1).indices.to(ctx.device)
        weights = torch.rand(tokens, k, generator=gen).softmax(dim=1).to(ctx.device)

        def dispatch_combine():
            d = ep.dispatch(x, topk_idx)
            return ep.combine(d.expert_x, d, weights)     # identity experts
        return dispatch_combine
    raise ValueError(f"unknown op {op!r}; choose one of {', '.join(OPS)}")


def _traced_run(ctx, op: str, opts: dict):
    call = _op_call(ctx, op, opts)
    call()                                     # compile the untraced kernels
    ctx.barrier()
    if ctx.backend == "cuda":                  # compile the TRACE=True ones, unrecorded
        with ctx.trace(None, capacity=opts["capacity"], print_summary=False):
            call()
    with ctx.trace(opts["output"], capacity=opts["capacity"]) as session:
        for _ in range(opts["iters"]):
            call()
    return session.summary if ctx.rank == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trident trace", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("op", choices=list(OPS), help="; ".join(f"{k}: {v}" for k, v in OPS.items()))
    parser.add_argument("-o", "--output", default=None, help="trace file (default trace-OP.json)")
    parser.add_argument("--world-size", type=int, default=None,
                        help="ranks (default: every visible GPU, or 4 CPU ranks)")
    parser.add_argument("--size", type=int, default=None,
                        help="elements per rank (default 1M on GPUs, 4096 on CPU)")
    parser.add_argument("--dtype", default=None, help="torch dtype name (default bfloat16 on "
                        "GPUs, float32 on CPU)")
    parser.add_argument("--iters", type=int, default=3, help="calls recorded (default 3)")
    parser.add_argument("--capacity", type=int, default=1 << 18, help="events per rank")
    parser.add_argument("--tokens", type=int, default=64, help="moe: tokens per rank")
    parser.add_argument("--hidden", type=int, default=1024, help="moe: hidden size")
    parser.add_argument("--experts", type=int, default=None, help="moe: experts (default 2*world)")
    parser.add_argument("--topk", type=int, default=2, help="moe: experts per token")
    args = parser.parse_args(argv)
    reason = unavailable(args.op)
    if reason:
        ready = [op for op in OPS if unavailable(op) is None]
        print(f"trident trace: {args.op} is not available: {reason}. "
              f"Available now: {', '.join(ready)}", file=sys.stderr)
        return 2
    for name in ("size", "iters", "capacity", "world_size", "tokens", "hidden", "topk"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")

    from ..runtime.launch import default_backend, launch
    backend = default_backend()
    opts = dict(vars(args))
    opts["output"] = os.path.abspath(args.output or f"trace-{args.op}.json")
    opts["size"] = args.size or ((1 << 20) if backend == "cuda" else 4096)
    heap = None if backend == "cuda" else 256 << 20
    launch(_traced_run, args.world_size, args.op, opts, backend=backend, heap_size=heap)
    print(f"open {opts['output']} in https://ui.perfetto.dev (rank = process, "
          f"program = thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
