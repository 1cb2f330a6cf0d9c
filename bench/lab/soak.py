"""Soak: many back-to-back collectives of random sizes, each checked bitwise on the device.

    PYTHONPATH=. python -m bench.lab.soak --ops 100000            # every visible GPU (2 ranks on one)
    PYTHONPATH=. python -m bench.lab.soak --ops 200 --backend cpu --world 2     # CPU emulation

Every rank draws the same sequence of ops from one seed: all_reduce, all_gather,
reduce_scatter, all_to_all (uneven splits, ranks that send or receive nothing) and
broadcast, each with one of its algorithms or "auto" (the selector), a random size from a
fixed set (log-spaced, odd sizes included, up to --max-numel elements per rank), dtype
and reduction. The ops come from a catalogue of random signatures drawn once from the
seed (SIGNATURES per op, A2A_SIGNATURES for all_to_all, each with its own splits; one
catalogue per half): each op picks its kind at random, then the next signature of that
kind from a shuffled deck, so every signature runs again and again, and a run builds at
most one launch plan per signature (on GPUs, where an eager build also builds the plan a
capture would use: two), whatever its length. Inputs are drawn on the device from the
seed, the op's number and, in graphs, a replay counter (soak_reference.py): every rank
can compute every rank's input without communication. Each op runs through trident and is
checked against a reference (--reference):
- nccl (the default where it is available): the same op through torch.distributed on the
  same inputs (NCCL on GPUs, gloo on the CPU emulation);
- torch (the default where ranks share a GPU, since NCCL refuses two ranks on one
  device): the expected output computed with plain torch from every rank's inputs, which
  each rank regenerates itself (sums over ranks, max/min, slices, cat); no trident kernel
  and no host collective. A run on one GPU checks correctness, not link speed.

The check of each op runs on the device, without a host synchronisation: the number of
elements where trident's output differs from the reference (bitwise; the inputs of sums
are small integers, so every summation order gives the same exact result) goes into that
op's own slot of a device tensor; trident's output is poisoned (NaN, or a sentinel for
integers) before the op, so an output it never wrote cannot pass. The host reads the
slots every --check-every ops (also checking the ranks' error words through
ctx.sync(), so a timed-out wait is reported, not hung on).

all_to_all splits come from SPLIT_PATTERNS fixed patterns per size and row length, a set
for each half; each half's catalogue holds A2A_SIGNATURES all_to_all signatures whose
splits differ on every rank, more than the all_to_all split-table cache holds
(SPLIT_CACHE_ENTRIES): a run that draws them all (each half of the default length does)
clears the cache while plans built with its tables run again, the case in which launch
plans once launched with tables the cache had freed; the summary says how many were
drawn, and how many plans were built.

Two ways of issuing ops, half the ops each on GPUs:
- eager: ops queued back to back from Python;
- graph: a CUDA graph of --graph-ops ops (inputs, and the torch reference, computed
  inside the graph, so every replay checks new data) replayed --replays times, then a
  new graph with new ops.
The CPU emulation runs the eager half only.

Prints a summary (reference, ops per kind and algorithm, mismatches, time) and writes the
same to a log (--log, default bench/results/soak-<backend>-<world>x-<date>.log). Exit
status 1 if any op mismatched or failed.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import random
import sys
import time
from collections import Counter

import torch

from . import soak_reference as reference

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
REDUCE_OPS = ("sum", "sum", "sum", "max", "min")
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MOVE_DTYPES = FLOAT_DTYPES + (torch.int32,)


# ---------------------------------------------------------------------------- the op list
def sizes(max_numel: int, seed: int) -> list[int]:
    """A small fixed set of per-rank element counts (so that signatures, launch plans and
    compiled kernels repeat): 1, 3, 31, then about one per two powers of two up to
    max_numel, half of them odd (11 sizes at 1M, 5 at 512)."""
    g = random.Random(seed ^ 0x5EED)
    out = {1, 3, 31}
    e = 5.0
    while 2 ** e <= max_numel:
        n = int(2 ** e)
        out.add(n | 1 if g.random() < 0.5 else n)
        e += 1.0 + 1.5 * g.random()
    return sorted(s for s in out if s <= max_numel)


REFERENCES = {
    "nccl": "reference: torch.distributed on the same inputs (NCCL on GPUs, gloo on the "
            "CPU emulation)",
    "torch": "reference: plain torch on every rank's inputs, each rank regenerating them "
             "from the seed on its device (soak_reference.py); no communication",
}
SPLIT_PATTERNS = 64         # per size and row length, per half
SIGNATURES = 64             # catalogue entries per op other than all_to_all, per half
A2A_SIGNATURES = 320        # all_to_all entries per half: more than SPLIT_CACHE_ENTRIES
# Entries of all_to_all's split-table cache (trident/ccl/all_to_all/rows.py: splits_tensor
# clears it when full; tests/test_soak.py checks this number against it). A soak of the
# default length draws many more distinct splits than that, the case in which a freed
# table once stayed in use by launch plans and graphs.
SPLIT_CACHE_ENTRIES = 256


def splits(world: int, rows_max: int, pattern: int) -> list[list[int]]:
    """all_to_all rows from rank s to rank d: even (a pattern that is a multiple of
    SPLIT_PATTERNS), or a fixed uneven one with zeros (ranks that send or receive nothing)
    per pattern. Patterns that recur let launch plans be reused; enough of them exceed the
    split-table cache."""
    if pattern % SPLIT_PATTERNS == 0:
        return [[rows_max] * world for _ in range(world)]
    g = random.Random(f"{world}-{rows_max}-{pattern}")
    return [[g.choice([0, rows_max, g.randint(0, rows_max)]) for _ in range(world)]
            for _ in range(world)]


def draw(g: random.Random, world: int, size_set: list[int], algorithms: dict,
         split_base: int = 0, op: str | None = None) -> dict:
    """One random signature, the same on every rank: op (`op`, else random), algorithm
    (None = auto), numel per rank, dtype, reduction, root, all_to_all splits (rows of
    `cols` elements, pattern split_base + 0 ... SPLIT_PATTERNS - 1: the graph half draws
    its own patterns, so that it too exceeds the split-table cache)."""
    op = op or g.choice(OPS)
    algos = sorted(algorithms[op])
    algorithm = g.choice(algos + [None])
    spec = {"op": op, "algorithm": algorithm, "numel": g.choice(size_set)}
    if op in ("all_reduce", "reduce_scatter"):
        spec["dtype"] = g.choice(FLOAT_DTYPES)
        spec["reduce"] = g.choice(REDUCE_OPS)
    else:
        spec["dtype"] = g.choice(MOVE_DTYPES)
    if op == "broadcast":
        spec["src"] = g.randrange(world)
    if op == "all_to_all":
        cols = g.choice([1, 2, 8, 64])
        spec["cols"] = cols
        spec["splits"] = splits(world, max(1, spec["numel"] // cols // world),
                                split_base + g.randrange(SPLIT_PATTERNS))
    spec["plain_input"] = g.random() < 0.1       # not on the heap: trident stages it
    return spec


class Catalogue:
    """The signatures one half of the soak draws its ops from: SIGNATURES distinct ones per
    op, A2A_SIGNATURES for all_to_all whose splits differ on every rank (split_key), all
    drawn from `g` (fewer where the sizes leave fewer). `next(g)` picks an op at random,
    then that op's next signature from a deck shuffled with `g` (every signature once
    before any twice)."""

    def __init__(self, g: random.Random, world: int, size_set: list[int], algorithms: dict,
                 split_base: int = 0):
        self.specs: dict = {}
        self.decks: dict = {op: [] for op in OPS}
        seen: set = set()
        splits_seen = [set() for _ in range(world)]
        for op in OPS:
            want = A2A_SIGNATURES if op == "all_to_all" else SIGNATURES
            specs = self.specs[op] = []
            for _ in range(20 * want):
                if len(specs) == want:
                    break
                spec = draw(g, world, size_set, algorithms, split_base, op)
                name = describe(spec)
                if name in seen:
                    continue
                if op == "all_to_all":
                    keys = [split_key(spec, r) for r in range(world)]
                    if any(k in s for k, s in zip(keys, splits_seen)):
                        continue
                    for k, s in zip(keys, splits_seen):
                        s.add(k)
                seen.add(name)
                specs.append(spec)

    def __len__(self) -> int:
        return sum(map(len, self.specs.values()))

    def next(self, g: random.Random) -> dict:
        """A fresh copy of the next op's signature (the soak adds its index to it)."""
        op = g.choice(OPS)
        deck = self.decks[op]
        if not deck:
            deck.extend(range(len(self.specs[op])))
            g.shuffle(deck)
        return dict(self.specs[op][deck.pop()])


def describe(spec: dict) -> str:
    parts = [spec["op"], spec["algorithm"] or "auto", f"n={spec['numel']}",
             str(spec["dtype"]).replace("torch.", "")]
    if "reduce" in spec:
        parts.append(spec["reduce"])
    if "src" in spec:
        parts.append(f"src={spec['src']}")
    if "splits" in spec:
        parts.append(f"splits={spec['splits']}x{spec['cols']}")
    if spec["plain_input"]:
        parts.append("plain input")
    return " ".join(parts)


# ---------------------------------------------------------------------------- one rank
class Buffers:
    """Heap and reference buffers of the largest size, viewed per op at the same address
    (so a signature repeats and its plan is reused)."""

    def __init__(self, ctx, max_numel: int):
        w = ctx.world_size
        nbytes = 4 * w * max_numel
        self.heap_in = ctx.empty(nbytes, dtype=torch.uint8)
        self.heap_out = ctx.empty(nbytes, dtype=torch.uint8)
        dev = ctx.device
        self.plain_in = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        self.ref_in = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        self.ref_out = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        self.replay = torch.zeros((), dtype=torch.int64, device=dev)   # graph replays
        # the inputs' hash table at its largest now: a graph capture may not make it
        reference.table(dev, reference.layout_places(w, max_numel))

    @staticmethod
    def view(buf, dtype, *shape):
        n = math.prod(shape)
        return buf[:n * dtype.itemsize].view(dtype).view(*shape)


def _poison(t: torch.Tensor) -> None:
    if t.numel():
        t.fill_(float("nan") if t.dtype.is_floating_point else -(1 << 30))


def shapes(spec: dict, world: int, rank: int) -> tuple[tuple, tuple]:
    """(input shape, output shape) of the op on `rank` (the same for in-place ops)."""
    n = spec["numel"]
    if spec["op"] == "all_to_all":
        S, c = spec["splits"], spec["cols"]
        return (sum(S[rank]), c), (sum(S[s][rank] for s in range(world)), c)
    if spec["op"] == "all_gather":
        return (n,), (world * n,)
    if spec["op"] == "reduce_scatter":
        return (world * n,), (n,)
    return (n,), (n,)


def _trident(ctx, spec: dict, got: torch.Tensor, inp: torch.Tensor) -> None:
    """The op through trident (in place on `got` for all_reduce and broadcast)."""
    op = spec["op"]
    algo = {"algorithm": spec["algorithm"]} if spec["algorithm"] else {}
    if spec["algorithm"] == "lamport" and _message_bytes(spec, got, inp) > _lamport_limit(ctx, op):
        # lamport refuses a message beyond its buffers (a named ValueError): such ops go
        # through "auto"
        algo = {}
    if op == "all_reduce":
        ctx.all_reduce(got, op=spec["reduce"], **algo)
    elif op == "broadcast":
        ctx.broadcast(got, src=spec["src"], **algo)
    elif op == "all_gather":
        ctx.all_gather(got, inp, **algo)
    elif op == "reduce_scatter":
        ctx.reduce_scatter(got, inp, op=spec["reduce"], **algo)
    else:
        S, r = spec["splits"], ctx.rank
        if spec["algorithm"] == "one_shot" and \
                max(map(max, S)) * spec["cols"] * got.element_size() > _one_shot_limit(ctx):
            # one_shot refuses a message beyond its scratch slot (a named ValueError, found
            # by the first one-GPU soak): such ops go through push
            algo = {"algorithm": "push"}
        ctx.all_to_all(got, inp, out_splits=[row[r] for row in S], in_splits=S[r], **algo)


def _message_bytes(spec: dict, got: torch.Tensor, inp: torch.Tensor) -> int:
    """The bytes per rank a Lamport algorithm counts: all_gather's input block,
    reduce_scatter's output block, all_to_all's largest block to or from a peer (of any
    rank: every rank decides alike), the tensor of the others."""
    if spec["op"] == "all_to_all":
        return max(map(max, spec["splits"])) * spec["cols"] * got.element_size()
    t = inp if spec["op"] == "all_gather" else got
    return t.numel() * t.element_size()


def _lamport_limit(ctx, op: str) -> int:
    from trident.ccl import lamport
    return lamport.limit(ctx, op)


def _one_shot_limit(ctx) -> int:
    """Bytes of one_shot all_to_all's per-peer message that surely fit its slot."""
    from trident.ccl.all_to_all.one_shot import slot_bytes
    return slot_bytes(ctx) - 4096


def _nccl(ctx, spec: dict, ref: torch.Tensor, ref_in: torch.Tensor, nccl) -> None:
    """The op through torch.distributed (in place on `ref` for all_reduce and broadcast)."""
    op = spec["op"]
    if op == "all_reduce":
        nccl.all_reduce(ctx, ref, spec["reduce"])
    elif op == "broadcast":
        nccl.broadcast(ctx, ref, spec["src"])
    elif op == "all_gather":
        nccl.all_gather(ctx, ref, ref_in)
    elif op == "reduce_scatter":
        nccl.reduce_scatter(ctx, ref, ref_in, spec["reduce"])
    else:
        S, r = spec["splits"], ctx.rank
        nccl.all_to_all(ctx, ref, ref_in, [row[r] for row in S], S[r])


def issue(ctx, spec: dict, bufs: Buffers, slot: torch.Tensor, key, nccl=None) -> None:
    """Queue one op through trident on this rank's input of op `key` (an int, or a 0-dim
    device tensor in graphs: soak_reference.op_key and input_of), and the count of
    elements that differ from the reference into `slot` (a 0-dim int64 device tensor).
    The reference: torch.distributed on the same inputs when `nccl` (the module trident.ccl.nccl) is given, else
    soak_reference.expected (plain torch on every rank's inputs, computed here)."""
    w, r, dtype = ctx.world_size, ctx.rank, spec["dtype"]
    in_shape, out_shape = shapes(spec, w, r)
    in_place = spec["op"] in ("all_reduce", "broadcast")
    V = Buffers.view
    inp = V(bufs.plain_in if spec["plain_input"] else bufs.heap_in, dtype, *in_shape)
    inp.copy_(reference.input_of(spec, r, w, key, ctx.device).view(in_shape))
    got = inp if in_place else V(bufs.heap_out, dtype, *out_shape)
    if nccl is not None:             # the reference's input, before trident writes got
        ref = V(bufs.ref_out, dtype, *out_shape)
        ref_in = ref if in_place else V(bufs.ref_in, dtype, *in_shape)
        ref_in.copy_(inp)
    if not in_place:
        _poison(got)
    _trident(ctx, spec, got, inp)
    if nccl is not None:
        _nccl(ctx, spec, ref, ref_in, nccl)
    else:
        ref = reference.expected(spec, r, w, key, ctx.device).view(out_shape)
    if spec.get("corrupt") and got.numel():            # --inject: proves the check bites
        got.view(-1)[:1].add_(1)
    torch.sum(torch.ne(got, ref).view(-1), dim=0, out=slot)


def choose_reference(ctx, asked: str | None) -> str:
    """"nccl" or "torch": `asked`, or NCCL where the context has it, else torch."""
    available = ctx.nccl_available
    if asked == "nccl" and not available:
        raise ValueError("soak --reference nccl: NCCL is not available to this job (ranks "
                         "share a GPU, so the host group is gloo); use --reference torch")
    return asked or ("nccl" if available else "torch")


def split_key(spec: dict, rank: int) -> tuple:
    """What the split table of an all_to_all on `rank` is cached by (trident/ccl/
    all_to_all/rows.py: splits_tensor, also by an output offset that is fixed here)."""
    S = spec["splits"]
    return tuple(S[rank]), tuple(row[rank] for row in S), spec["cols"]


def eager_ops(args, backend: str) -> int:
    """How many of the ops are eager: all on the CPU or with --no-graph, else half."""
    graph = backend == "cuda" and not args.no_graph
    return args.ops - args.ops // 2 if graph else args.ops


def graph_batches(args, start: int):
    """(first op, ops per graph, replays) of each graph, for ops start ... args.ops - 1."""
    i = start
    while i < args.ops:
        k = min(args.graph_ops, args.ops - i)
        reps = max(1, min(args.replays, (args.ops - i) // k))
        yield i, k, reps
        i += k * reps


def run_rank(ctx, args) -> dict:
    """One rank's soak (every rank runs it); returns its counts, times and mismatches."""
    timeout = ctx.timeout_s
    ctx.set_timeout(args.timeout)
    try:
        return _soak(ctx, args)
    finally:
        ctx.set_timeout(timeout)


def _soak(ctx, args) -> dict:
    from trident.ccl import ALGORITHMS, nccl as nccl_ops
    ref = choose_reference(ctx, args.reference)
    nccl = nccl_ops if ref == "nccl" else None
    g = random.Random(args.seed)
    size_set = sizes(args.max_numel, args.seed)
    bufs = Buffers(ctx, args.max_numel)
    n_eager = eager_ops(args, ctx.backend)
    catalogues = {"eager": Catalogue(g, ctx.world_size, size_set, ALGORITHMS),
                  "graph": Catalogue(g, ctx.world_size, size_set, ALGORITHMS, SPLIT_PATTERNS)}
    errs = torch.zeros(args.ops, dtype=torch.int64, device=ctx.device)
    specs: list[dict] = []
    split_keys: dict = {"eager": set(), "graph": set()}
    counts: Counter = Counter()
    log: list[str] = []
    checked = [0]

    def say(line: str) -> None:
        log.append(line)
        if ctx.rank == 0:
            print(line, flush=True)

    def spec_at(i: int, mode: str) -> dict:
        spec = catalogues[mode].next(g)
        spec["index"] = i
        spec["corrupt"] = i == args.inject and ctx.rank == 0
        if spec["op"] == "all_to_all":
            split_keys[mode].add(split_key(spec, ctx.rank))
        specs.append(spec)
        return spec

    def checkpoint(upto: int, mode: str, t0: float) -> None:
        ctx.sync()
        bad = int((errs[checked[0]:upto] != 0).sum())
        checked[0] = upto
        say(f"  {mode}: {upto} ops issued, {time.perf_counter() - t0:7.1f} s, "
            f"mismatching ops so far on rank {ctx.rank}: {int((errs[:upto] != 0).sum())}"
            + (f" (+{bad})" if bad else ""))

    for line in setting(ref, ctx.ranks_per_device):
        say(line)
    ctx.barrier()
    builds = ctx.plans.builds
    # ---- eager: ops back to back from Python
    t0 = time.perf_counter()
    for i in range(n_eager):
        spec = spec_at(i, "eager")
        issue(ctx, spec, bufs, errs[i], reference.op_key(args.seed, i), nccl)
        counts[("eager", spec["op"], spec["algorithm"] or "auto")] += 1
        if (i + 1) % args.check_every == 0 or i + 1 == n_eager:
            checkpoint(i + 1, "eager", t0)
    ctx.sync()
    t_eager = time.perf_counter() - t0
    eager_builds = ctx.plans.builds - builds
    # ---- graph: a graph of graph_ops ops, replayed; then the next graph
    t0 = time.perf_counter()
    graphs, captures_s = 0, 0.0
    for first, k, reps in graph_batches(args, n_eager):
        batch = [spec_at(first + j, "graph") for j in range(k)]
        slots = torch.zeros(k, dtype=torch.int64, device=ctx.device)
        tc = time.perf_counter()
        graph_obj = _capture(ctx, batch, bufs, slots, args.seed, nccl)
        captures_s += time.perf_counter() - tc
        graphs += 1
        for rep in range(reps):
            at = first + rep * k
            graph_obj.replay()
            errs[at:at + k].copy_(slots)
            if rep + 1 < reps:         # the next replay's ops: the same specs again
                specs.extend(batch)
            for spec in batch:
                counts[("graph", spec["op"], spec["algorithm"] or "auto")] += 1
            if (at + k) // args.check_every != at // args.check_every or at + k == args.ops:
                checkpoint(at + k, "graph", t0)
        ctx.sync()
        del graph_obj
    t_graph = time.perf_counter() - t0
    ctx.sync()
    bad = (errs != 0).nonzero().flatten().tolist()
    return {"rank": ctx.rank, "counts": dict(counts), "eager_ops": n_eager,
            "graph_ops": args.ops - n_eager, "t_eager": t_eager, "t_graph": t_graph,
            "graphs": graphs, "captures_s": captures_s, "reference": ref,
            "ranks_per_device": ctx.ranks_per_device,
            "split_patterns": {mode: len(keys) for mode, keys in split_keys.items()},
            "signatures": {mode: len(c) for mode, c in catalogues.items()},
            "plan_builds": (eager_builds, ctx.plans.builds - builds - eager_builds),
            "mismatches": [(j, int(errs[j]), describe(specs[j])) for j in bad[:100]],
            "num_mismatches": len(bad), "sizes": size_set, "log": log}


def _capture(ctx, batch, bufs, slots, seed: int, nccl):
    """One CUDA graph of the batch's ops. Warm-up first on a side stream, with the plans a
    capture uses (workspaces are made there: a capture may not allocate on the heap).
    Each run of the graph first bumps the replay counter, so that its inputs (and, with
    the torch reference, its expected outputs) are new on every replay."""
    from trident.bench.common import _graph_plans

    def ops():
        bufs.replay.add_(1)
        for j, spec in enumerate(batch):
            issue(ctx, spec, bufs, slots[j], reference.op_key(seed, spec["index"], bufs.replay),
                  nccl)

    side = torch.cuda.Stream(device=ctx.device)
    side.wait_stream(torch.cuda.current_stream(ctx.device))
    with torch.cuda.stream(side), _graph_plans(ctx):
        ops()
    torch.cuda.current_stream(ctx.device).wait_stream(side)
    ctx.sync()
    ctx.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        ops()
    ctx.barrier()
    return graph


def setting(ref: str, ranks_per_device: int) -> list[str]:
    """The lines that say what a run checks against, and on what."""
    lines = [REFERENCES[ref]]
    if ranks_per_device > 1:
        lines.append(f"ranks share a GPU ({ranks_per_device} per GPU): this run checks "
                     "correctness on one GPU, not link speed")
    return lines


# ---------------------------------------------------------------------------- the launcher
def summary(args, results, wall: float) -> tuple[str, int]:
    """(the summary's text, the number of mismatching ops over all ranks)."""
    r0, world, backend = results[0], len(results), args.backend
    lines = [f"trident soak: {args.ops} ops, world {world}, backend {backend}, seed {args.seed}, "
             f"max {args.max_numel} elements per rank",
             f"sizes per rank: {r0['sizes']}",
             f"eager: {r0['eager_ops']} ops in {r0['t_eager']:.1f} s; graph: {r0['graph_ops']} "
             f"ops in {r0['t_graph']:.1f} s ({r0['graphs']} graphs, capture {r0['captures_s']:.1f} s)"
             + ("" if backend == "cuda" and not args.no_graph else " (graph mode: GPUs only)"),
             *setting(r0["reference"], r0["ranks_per_device"]),
             split_line(r0["split_patterns"], r0["counts"]),
             plans_line(r0["signatures"], r0["plan_builds"], r0["eager_ops"], r0["graph_ops"]),
             "", f"{'mode':6} {'op':15} {'algorithm':12} {'ops':>8}"]
    for (mode, op, algo), n in sorted(r0["counts"].items()):
        lines.append(f"{mode:6} {op:15} {algo:12} {n:8d}")
    total_bad = 0
    lines.append("")
    for r in results:
        total_bad += r["num_mismatches"]
        lines.append(f"rank {r['rank']}: {r['num_mismatches']} mismatching ops")
        for j, n, what in r["mismatches"]:
            lines.append(f"  op {j}: {n} elements differ: {what}")
    lines.append(f"mismatches: {total_bad} (ops checked: {args.ops} on each of {world} ranks); "
                 f"wall time {wall:.1f} s")
    return "\n".join(lines), total_bad


def split_line(patterns: dict, counts: dict) -> str:
    """What the all_to_all ops' splits did to the split-table cache (rank 0's view)."""
    ran = {mode for (mode, op, _), n in counts.items() if op == "all_to_all" and n}
    parts = [f"{patterns[mode]} {mode}" for mode in ("eager", "graph") if mode in ran]
    over = [mode for mode in ("eager", "graph") if patterns[mode] > SPLIT_CACHE_ENTRIES]
    verdict = (f"more than the {SPLIT_CACHE_ENTRIES} entries of the split-table cache in "
               f"{' and '.join(over)} ops: the cache is cleared while launch plans and "
               "graphs hold its tables (the use-after-free case)" if over else
               f"not more than the {SPLIT_CACHE_ENTRIES} entries of the split-table cache: "
               "the case of tables dropped while in use is not exercised (run more ops)")
    return (f"all_to_all splits on rank 0: {', '.join(parts) or 'none'} distinct; {verdict}")


def plans_line(signatures: dict, builds: tuple, eager: int, graph: int) -> str:
    """How many signatures each half drew from, and the launch plans rank 0 built."""
    per = 1000 * sum(builds) / max(1, eager + graph)
    return (f"signatures: {signatures['eager']} eager, {signatures['graph']} graph; launch "
            f"plans built on rank 0: {builds[0]} eager, {builds[1]} graph ({per:.0f} per "
            f"1000 ops)")


def parse(argv=None) -> argparse.Namespace:
    """The options, with the defaults that depend on the backend filled in."""
    p = argparse.ArgumentParser(prog="python -m bench.lab.soak",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=100_000, help="ops in all (default 100000)")
    p.add_argument("--world", type=int, default=None, help="ranks (default: every GPU, at least 2: two "
                   "share a GPU on a one-GPU machine; 2 on the CPU)")
    p.add_argument("--backend", choices=("cuda", "cpu"), default=None)
    p.add_argument("--reference", choices=tuple(REFERENCES), default=None,
                   help="what each op is checked against (default: nccl where it is "
                        "available, else torch: ranks that share a GPU)")
    p.add_argument("--max-numel", type=int, default=None,
                   help="largest size per rank in elements (default 1M on GPUs, 512 on the CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-every", type=int, default=2000, help="host check every K ops")
    p.add_argument("--graph-ops", type=int, default=64, help="ops per CUDA graph")
    p.add_argument("--replays", type=int, default=16, help="replays of each CUDA graph")
    p.add_argument("--no-graph", action="store_true", help="eager ops only")
    p.add_argument("--timeout", type=float, default=60.0, help="device wait limit, s")
    p.add_argument("--heap-size", type=int, default=None)
    p.add_argument("--log", default=None, help="log file (default bench/results/soak-*.log)")
    p.add_argument("--inject", type=int, default=-1, help=argparse.SUPPRESS)  # corrupt op N (tests)
    args = p.parse_args(argv)
    from trident.runtime.launch import default_backend, default_world_size
    args.backend = args.backend or default_backend()
    args.world = args.world or (max(2, default_world_size("cuda")) if args.backend == "cuda"
                                else 2)
    if args.max_numel is None:
        args.max_numel = (1 << 20) if args.backend == "cuda" else 512
    args.heap_size = args.heap_size or ((2 << 30) if args.backend == "cuda" else 64 << 20)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv=None) -> int:
    args = parse(argv)
    from trident.runtime.launch import launch
    backend, world = args.backend, args.world
    os.environ.setdefault("TRIDENT_PLAN_CACHE", "32768")   # every signature keeps its plan
    t0 = time.perf_counter()
    results = launch(run_rank, world, args, backend=backend, heap_size=args.heap_size,
                     timeout=args.timeout, run_timeout=3600.0)
    wall = time.perf_counter() - t0
    text, bad = summary(args, results, wall)
    print(text)
    path = args.log or os.path.join(
        "bench", "results",
        f"soak-{backend}-{world}x-{datetime.date.today().isoformat()}.log")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(f"command: python -m bench.lab.soak {' '.join(args.argv)}\n")
        f.write(f"torch {torch.__version__}")
        try:
            import triton
            f.write(f", triton {triton.__version__}")
        except ImportError:
            pass
        if backend == "cuda":
            gpus = min(world, torch.cuda.device_count())
            f.write(f", {world} ranks on {gpus} x {torch.cuda.get_device_name(0)}")
        f.write("\n\nprogress (rank 0):\n" + "\n".join(results[0]["log"]) + "\n\n" + text + "\n")
    print(f"log: {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
