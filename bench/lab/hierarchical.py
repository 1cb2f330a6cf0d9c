"""Launches and host time per warm call of the paths across nodes, beside the single-node
op they are built from (`python -m bench.lab.hierarchical [--world 4 --node-size 2]
[--json PATH]`): issue 23's target, "the hierarchical path costs at most one extra launch
per intra-node step beyond the single-node op".

The ranks start as nodes of --node-size (TRIDENT_NODE_SIZE in their environment), so
`trident.init` gives a trident.WorldContext. Cases, at 256 fp32 (1 KiB) per rank
(all_reduce's and broadcast's tensor, all_gather's input, reduce_scatter's output,
all_to_all's block per peer), tensors on the heap (--memory plain: torch tensors):
  - all_reduce, all_gather, reduce_scatter, all_to_all (even), broadcast, each with
    algorithm "hierarchical" (trident inside the node, torch.distributed on the rails)
    and "nccl" (one torch.distributed collective over the world);
  - MoE across nodes (td.ExpertParallel on the WorldContext) dispatch and combine, at a
    small shape (--moe experts,top-k,hidden,tokens; bf16);
  - baseline of each: the same op on ctx.node (one node's ranks; for MoE an
    ExpertParallel on ctx.node with the node's experts and the same tokens per rank).
Per warm call (trident/bench/counting.py says how each is counted): Triton launches (plan
Launches and direct kernel[grid] launches), torch ops that run device work ("torch
kernels": copies, fills, index ops) and views, torch.distributed collectives, intra-node
steps (the outermost calls of ctx.node's collectives and of the node's ExpertParallel),
host syncs, host collectives and plan builds (all three 0 in a warm call). From them:
  extra/step = (launches - baseline launches) / intra-node steps  (the target: <= 1),
and +torch/step, the same with torch kernels added to both (each is a launch on a GPU too:
what a GPU queues, the rail's collectives apart), with its own verdict.
The table shows rank 0; the verdict takes the worst rank (ranks off the broadcast's
source rail make no rail call, for one).

Times (common.time_modes, max over ranks of the median batch):
  - on GPUs: host_us (Python time per call while queueing), eager_us (device time per
    call, calls back to back) and graph_us (replayed from one CUDA graph; not where the
    rails go through host copies: ranks sharing a GPU, gloo);
  - on the CPU emulation: wall_us, the wall time per call (kernels run under the Triton
    interpreter, so it says little), and silent_us: rank 0 alone, every Triton launch,
    plan host step and torch.distributed collective made a no-op (as
    trident/bench/host.py does for one node), the fastest batch: the Python of the path
    itself (checks, selection, scratch views, the torch ops that stay); median beside it.
The context is reset after the silent pass (rank 0 ran calls the others did not).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

from trident.bench import common, counting

from . import silent as silencing

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
N = 256                                     # fp32 elements: 1 KiB per rank
NODE_STEPS = OPS                            # ctx.node's methods that are intra-node steps
EP_STEPS = ("dispatch", "combine")
STAGED_NOTE = "not capturable: the rails go through host copies (ranks share a GPU, gloo)"


class Item:
    """One measured call: fn() after setup(); steps = [(object, method names)] whose calls
    are intra-node steps; graph: whether time_modes tries a CUDA graph; skip: why not run."""

    def __init__(self, fn, steps, setup=None, graph=True, skip=None):
        self.fn, self.steps, self.setup = fn, steps, setup or (lambda: None)
        self.graph, self.skip = graph, skip


def _items(ctx, memory: str, moe: tuple) -> tuple[dict, dict, list]:
    """({(op, path): Item}, {op: baseline Item}, [ExpertParallels to close, then heap
    tensors to free])."""
    import trident as td
    from trident.nodes import rail
    node, topo, dev = ctx.node, ctx.topology, ctx.device
    w, l, m = ctx.world_size, topo.node_size, topo.num_nodes
    gen = torch.Generator().manual_seed(1234 + ctx.rank)
    owned = []                                  # to close or free at the end

    def make(n):
        t = ctx.empty(n) if memory == "heap" else torch.empty(n, device=dev)
        owned.extend([t] if memory == "heap" else [])
        return t.copy_(torch.randn(n, generator=gen))
    t, tn, b, bn, ag_in = make(N), make(N), make(N), make(N), make(N)
    ag_out, ag_out_n = make(w * N), make(l * N)
    rs_in, rs_in_n, rs_out = make(w * N), make(l * N), make(N)
    a_in, a_out, a_in_n, a_out_n = make(w * N), make(w * N), make(l * N), make(l * N)
    calls = {
        "all_reduce": (lambda a: ctx.all_reduce(t, algorithm=a), lambda: node.all_reduce(tn)),
        "all_gather": (lambda a: ctx.all_gather(ag_out, ag_in, algorithm=a),
                       lambda: node.all_gather(ag_out_n, ag_in)),
        "reduce_scatter": (lambda a: ctx.reduce_scatter(rs_out, rs_in, algorithm=a),
                           lambda: node.reduce_scatter(rs_out, rs_in_n)),
        "all_to_all": (lambda a: ctx.all_to_all(a_out, a_in, algorithm=a),
                       lambda: node.all_to_all(a_out_n, a_in_n)),
        "broadcast": (lambda a: ctx.broadcast(b, algorithm=a), lambda: node.broadcast(bn)),
    }
    staged = rail.staged(node, topo.rail_group)
    no_nccl = None if common.nccl_runs(ctx) else common.NO_NCCL
    steps = [(node, NODE_STEPS)]
    items, base = {}, {}
    for op, (world_call, node_call) in calls.items():
        items[(op, "hierarchical")] = Item(lambda f=world_call: f("hierarchical"), steps,
                                           graph=not staged)
        items[(op, "nccl")] = Item(lambda f=world_call: f("nccl"), steps, skip=no_nccl)
        base[op] = Item(node_call, steps)
    experts, k, hidden, tokens = moe
    ep = td.ExpertParallel(ctx, experts, k, hidden, tokens)
    ep_n = td.ExpertParallel(node, experts // m, k, hidden, tokens)
    x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16).to(dev)
    weights = torch.rand(tokens, k, generator=gen).to(dev)

    def ids(e):
        return torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(tokens)]).to(dev)
    idx, idx_n, state = ids(experts), ids(experts // m), {}
    for name, e, i in (("hierarchical", ep, idx), ("node", ep_n, idx_n)):
        owner = ep.node_ep if e is ep else e
        e_steps = steps + [(owner, EP_STEPS)]

        def dispatch(e=e, i=i, name=name):
            state[name] = e.dispatch(x, i)

        def combine(e=e, name=name):
            d = state[name]
            e.combine(d.expert_x, d, weights)
        pair = (Item(dispatch, e_steps, graph=not staged or e is ep_n),
                Item(combine, e_steps, setup=dispatch, graph=not staged or e is ep_n))
        for op, item in zip(("moe dispatch", "moe combine"), pair):
            if e is ep:
                items[(op, "across nodes")] = item
            else:
                base[op] = item
    return items, base, [ep, ep_n] + owned


def _counted(ctx, item: Item, calls: int) -> dict | None:
    if item.skip:
        return None
    item.setup()
    return counting.count_calls(ctx.node, item.fn, calls, item.steps)


def _timed(ctx, item: Item, opts: dict) -> dict:
    if item.skip:
        return common.skipped(item.skip)
    item.setup()
    t = common.time_modes(ctx, item.fn, calls=opts["calls"], reps=opts["reps"],
                          warmup=opts["warmup"], graph=item.graph)
    if ctx.backend == "cuda" and not item.graph:
        t["graph_note"] = STAGED_NOTE
    return t


SUMMARY = ("triton_launches", "torch_kernels", "collectives", "intra_node_steps",
           "host_syncs", "host_collectives", "builds")


def _extra(mine: dict | None, base: dict) -> tuple:
    """(extra launches per intra-node step over the baseline, the same with torch kernels
    added to both) of one rank's counts; Nones without intra-node steps."""
    if not mine or not mine["intra_node_steps"]:
        return None, None
    steps = mine["intra_node_steps"]
    extra = (mine["triton_launches"] - base["triton_launches"]) / steps
    return extra, extra + (mine["torch_kernels"] - base["torch_kernels"]) / steps


def measure(ctx, opts: dict) -> dict:
    """Run on every rank of a WorldContext: {"rows", "extra", "path"} (see the module
    docstring); every rank returns the same."""
    if not getattr(ctx, "spans_nodes", False):
        raise ValueError("bench.lab.hierarchical needs a context across nodes: start the "
                         "ranks with TRIDENT_NODE_SIZE below the world size (--node-size)")
    items, base, owned = _items(ctx, opts["memory"], opts["moe"])
    keys = [k for k in items if k[0] in opts["ops"]] + [(op, "node op") for op in base
                                                          if op in opts["ops"]]
    every = [items[k] if k in items else base[k[0]] for k in keys]
    for item in every:                                  # plans built, buffers made
        if not item.skip:
            item.setup()
            item.fn()
            item.fn()
    ctx.barrier()
    counts = [_counted(ctx, item, opts["count_calls"]) for item in every]
    ranks = [None] * ctx.world_size                     # every rank's summary
    dist.all_gather_object(ranks, [c and {k: c[k] for k in SUMMARY} for c in counts],
                           group=ctx.group)
    times = [_timed(ctx, item, opts) for item in every]
    silent = [{}] * len(every)
    if ctx.backend != "cuda" and opts["silent_calls"]:
        ctx.barrier()
        silent = silencing.times(ctx, every, opts["silent_calls"], opts["batch"])
        ctx.reset()
    for obj in owned:
        if isinstance(obj, torch.Tensor):
            ctx.free(obj)
        else:
            obj.close()
    rows = []
    for i, (op, path) in enumerate(keys):
        if path == "node op":
            continue
        j = keys.index((op, "node op"))
        extras = [_extra(r[i], r[j]) for r in ranks]
        worst = [max((e[n] for e in extras if e[n] is not None), default=None) for n in (0, 1)]
        rows.append(dict(
            op=op, path=path, **_flat(counts[i], times[i], silent[i]),
            **_flat(counts[j], times[j], silent[j], prefix="base_"),
            extra_per_step=worst[0], extra_with_torch_per_step=worst[1],
            target_met=None if worst[0] is None else worst[0] <= 1,
            target_met_with_torch=None if worst[1] is None else worst[1] <= 1,
            per_rank=[dict(rank=r, counts=ranks[r][i], base=ranks[r][j])
                      for r in range(ctx.world_size)]))
    topo = ctx.topology
    extra = dict(layout=f"{topo.num_nodes} nodes x {topo.node_size}", memory=opts["memory"],
                 bytes_per_rank=4 * N, moe_shape=dict(zip(
                     ("experts", "top_k", "hidden", "tokens"), opts["moe"])),
                 options=opts, headline=common.headline(ctx))
    path = common.write_results(ctx, "hierarchical", rows, extra, out_dir=opts["out_dir"],
                                path=opts["json"])
    return dict(rows=rows, extra=extra, path=path)


def _flat(counts: dict | None, times: dict, silent: dict, prefix: str = "") -> dict:
    out = dict(counts or dict.fromkeys(("triton_launches", "torch_kernels", "collectives",
                                        "intra_node_steps", "host_syncs")))
    out.update({k: times.get(k) for k in ("eager_us", "graph_us", "host_us", "graph_note",
                                          "calls", "note")})
    out.update(silent)
    return {prefix + k: v for k, v in out.items()}


def run(world: int, node_size: int, opts: dict, backend: str | None = None,
        pool=None) -> dict:
    """measure() on `world` ranks in nodes of `node_size` (or in `pool`, whose ranks form
    nodes already); returns rank 0's result."""
    if pool is not None:
        return pool.run(measure, opts)[0]
    from trident.runtime.launch import default_backend
    from trident.nodes.topology import pool_in_nodes
    backend = backend or default_backend()
    pool = pool_in_nodes(world, node_size, backend=backend,
                         heap_size=(1 << 30) if backend == "cuda" else 64 << 20,
                         timeout=120.0, run_timeout=1200.0)
    try:
        return pool.run(measure, opts)[0]
    finally:
        pool.close()


COUNT_COLUMNS = ("launches", "torch", "dist", "steps", "syncs", "base launches", "base torch",
                 "extra/step", "target", "+torch/step", "target+torch")
VERDICT = {True: "met", False: "MISSED", None: "-"}


def table(result: dict, gpu: bool) -> str:
    """The printed table (rank 0's counts; the target as judged on the worst rank)."""
    import io
    rows = []
    for r in result["rows"]:
        cells = {"op": r["op"], "path": r["path"], "launches": r["triton_launches"],
                 "torch": r["torch_kernels"], "dist": r["collectives"],
                 "steps": r["intra_node_steps"], "syncs": r["host_syncs"],
                 "base launches": r["base_triton_launches"], "base torch": r["base_torch_kernels"],
                 "extra/step": r["extra_per_step"],
                 "target": VERDICT[r["target_met"]],
                 "+torch/step": r["extra_with_torch_per_step"],
                 "target+torch": VERDICT[r["target_met_with_torch"]]}
        if gpu:
            for k in ("host_us", "eager_us", "graph_us"):
                cells[k], cells["base " + k] = r[k], r["base_" + k]
        else:
            cells.update({"wall_us": r["eager_us"], "base wall_us": r["base_eager_us"],
                          "silent_us": r.get("silent_us"), "base silent_us": r.get("base_silent_us")})
        cells["note"] = r.get("note") or r.get("silent_note") or (
            r.get("graph_note") if gpu and r.get("graph_us") is None else None)
        rows.append(cells)
    timing = (["host_us", "base host_us", "eager_us", "base eager_us", "graph_us", "base graph_us"]
              if gpu else ["wall_us", "base wall_us", "silent_us", "base silent_us"])
    buf = io.StringIO()
    common.print_table(rows, ["op", "path", *COUNT_COLUMNS, *timing], file=buf)
    return buf.getvalue()


def _moe_shape(text: str, world: int) -> tuple:
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise ValueError(f"--moe takes experts,top_k,hidden,tokens (positive integers), "
                         f"got {text!r}")
    if shape[0] % world:
        raise ValueError(f"--moe: {shape[0]} experts do not split over {world} ranks")
    return shape


def main(argv=None) -> int:
    from trident.nodes import topology
    from trident.runtime.launch import default_backend
    p = argparse.ArgumentParser(prog="python -m bench.lab.hierarchical", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", "--world-size", type=int, default=None,
                   help="ranks (default: 4 on the CPU, one per GPU on GPUs)")
    p.add_argument("--node-size", type=int, default=None,
                   help=f"ranks per node (default: ${topology.NODE_SIZE_ENV}, else world/2)")
    p.add_argument("--backend", choices=("cuda", "cpu"), default=None)
    p.add_argument("--ops", default=",".join(OPS + ("moe",)),
                   help="comma-separated subset of " + ",".join(OPS + ("moe",)))
    p.add_argument("--memory", choices=("heap", "plain"), default="heap",
                   help="the tensors: on the node's symmetric heap, or plain torch tensors")
    p.add_argument("--moe", default=None, help="experts,top_k,hidden,tokens "
                   "(default 4*world,2,128,8)")
    p.add_argument("--count-calls", type=int, default=3, help="warm calls counted")
    p.add_argument("--calls", type=int, default=None, help="calls per timed batch "
                   f"(default {common.CALLS} on GPUs, 3 on the CPU)")
    p.add_argument("--reps", type=int, default=None, help="timed batches (median; default 5)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--silent-calls", type=int, default=1000,
                   help="calls of the silent pass (CPU emulation; 0: none)")
    p.add_argument("--batch", type=int, default=50, help="calls per silent batch")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--out-dir", default=None, help="else write them here, named after the "
                   "run (default ./trident-results)")
    args = p.parse_args(argv)
    backend = args.backend or default_backend()
    gpu = backend == "cuda"
    world = args.world or common.default_world(backend, cpu=4)
    node_size = args.node_size or int(os.environ.get(topology.NODE_SIZE_ENV) or 0) or world // 2
    if node_size < 1 or world % node_size or world // node_size < 2:
        p.error(f"--node-size {node_size} must split --world {world} into 2 or more nodes")
    chosen = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in chosen if o not in OPS + ("moe",)]
    if bad:
        p.error(f"unknown op(s) {bad}; choose from {list(OPS) + ['moe']}")
    try:
        moe = _moe_shape(args.moe or f"{4 * world},2,128,8", world)
    except ValueError as e:
        p.error(str(e))
    ops = [o for o in chosen if o != "moe"] + (["moe dispatch", "moe combine"]
                                               if "moe" in chosen else [])
    opts = dict(ops=ops, memory=args.memory, moe=moe, count_calls=args.count_calls,
                calls=args.calls or (common.CALLS if gpu else 3), reps=args.reps or (5 if gpu else 3),
                warmup=args.warmup if args.warmup is not None else (3 if gpu else 1),
                silent_calls=args.silent_calls, batch=args.batch, json=args.json,
                out_dir=args.out_dir)
    result = run(world, node_size, opts, backend)
    extra = result["extra"]
    print(f"{extra['layout']} ({world} ranks, {backend}), {extra['bytes_per_rank']} B per rank "
          f"({extra['memory']} tensors), MoE {extra['moe_shape']}; counts per warm call "
          f"(rank 0), extra/step judged on the worst rank")
    if extra["headline"]:
        print(extra["headline"])
    print(table(result, gpu), end="")
    print(f"results: {result['path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
