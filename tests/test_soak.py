"""The GPU soak script (bench/lab/soak.py), run small on whatever backend the tests use:
its ops must all match torch.distributed and the torch reference (soak_reference.py), and
a corrupted op must be caught and named."""
import os
import random

import pytest
import torch

from bench.lab import soak
from trident.ccl import ALGORITHMS
from trident.ccl.all_to_all import rows

from .conftest import get_pool

OPS = int(os.environ.get("TRIDENT_SOAK_TEST_OPS", "200"))


@pytest.fixture
def pool2():
    """The session's pool of 2 ranks (the soak's world size on the lead's GPUs)."""
    return get_pool(2)


def _args(*extra, ops=OPS):
    return soak.parse(["--ops", str(ops), "--check-every", "50", "--graph-ops", "16",
                       "--replays", "2", "--max-numel", "512", *extra])


def test_soak_small(pool2):
    """--ops 100 (half of them from CUDA graphs on GPUs) against the default reference
    (torch.distributed here): zero mismatches on every rank."""
    args = _args(ops=OPS // 2)
    results = pool2.run(soak.run_rank, args)
    text, bad = soak.summary(args, results, 0.0)
    assert bad == 0, text
    r0 = results[0]
    assert r0["reference"] == ("nccl" if pool2.run(_nccl_available)[0] else "torch")
    assert r0["eager_ops"] + r0["graph_ops"] == OPS // 2
    assert sum(r0["counts"].values()) == OPS // 2
    assert {op for (_, op, _) in r0["counts"]} == set(soak.OPS), text
    # one plan per signature drawn (on GPUs an eager build also builds its capture twin)
    backend = pool2.run(_backend)[0]
    drawn = _drawn(args, 2, backend)
    per = 2 if backend == "cuda" else 1
    assert r0["plan_builds"][0] <= per * len(drawn["eager"]), (r0["plan_builds"], drawn)
    assert r0["plan_builds"][1] <= len(drawn["graph"]), (r0["plan_builds"], drawn)
    assert "launch plans built on rank 0" in text


def _backend(ctx):
    return ctx.backend


def _drawn(args, world, backend, key=soak.describe):
    """{"eager": set, "graph": set} of key(spec) over the ops a soak draws, as the ranks
    draw them (host only)."""
    g, size_set = random.Random(args.seed), soak.sizes(args.max_numel, args.seed)
    cats = {"eager": soak.Catalogue(g, world, size_set, ALGORITHMS),
            "graph": soak.Catalogue(g, world, size_set, ALGORITHMS, soak.SPLIT_PATTERNS)}
    n_eager = soak.eager_ops(args, backend)
    modes = ["eager"] * n_eager + ["graph"] * sum(k for _, k, _ in
                                                  soak.graph_batches(args, n_eager))
    out = {"eager": set(), "graph": set()}
    for mode in modes:
        spec = cats[mode].next(g)
        if key is not None and (key is soak.describe or spec["op"] == "all_to_all"):
            out[mode].add(key(spec))
    return out


def _nccl_available(ctx):
    return ctx.nccl_available


def test_soak_catches_a_wrong_result(pool2):
    """An op whose trident output is corrupted on rank 0 (--inject 5) is the one mismatch,
    named with its op, size and dtype."""
    args = soak.parse(["--ops", "12", "--inject", "5", "--no-graph", "--max-numel", "64"])
    results = pool2.run(soak.run_rank, args)
    text, bad = soak.summary(args, results, 0.0)
    assert bad == 1, text
    ((j, n, what),) = results[0]["mismatches"]
    assert j == 5 and n == 1 and what.split()[0] in soak.OPS, text
    assert "op 5: 1 elements differ" in text


@pytest.mark.parametrize("world,ops", [(2, OPS), (3, OPS // 2)])
def test_soak_torch_reference(world, ops):
    """--reference torch (what runs where ranks share a GPU): every rank regenerates every
    rank's inputs and checks against plain torch; zero mismatches at 2 ranks (200 ops)
    and 3 (100, to keep the test short), and the summary names the reference."""
    args = _args("--reference", "torch", ops=ops)
    results = get_pool(world).run(soak.run_rank, args)
    text, bad = soak.summary(args, results, 0.0)
    assert bad == 0, text
    assert {r["reference"] for r in results} == {"torch"}
    assert sum(results[0]["counts"].values()) == ops
    assert {op for (_, op, _) in results[0]["counts"]} == set(soak.OPS), text
    assert soak.REFERENCES["torch"] in text


def test_main_torch_reference_catches_a_wrong_result(tmp_path):
    """The command line end to end (its own ranks, through trident.launch), tiny, with the
    torch reference: op 3 corrupted on rank 0 is the one mismatch, and the exit status is
    1; the log says which reference checked it."""
    log = tmp_path / "soak.log"
    argv = ["--ops", "10", "--world", "2", "--max-numel", "64", "--no-graph",
            "--reference", "torch", "--inject", "3", "--log", str(log)]
    assert soak.main(argv) == 1
    text = log.read_text()
    assert "command: python -m bench.lab.soak --ops 10" in text
    assert "op 3: 1 elements differ" in text
    assert "mismatches: 1 " in text
    assert soak.REFERENCES["torch"] in text


def test_setting_says_one_gpu_checks_correctness():
    """Ranks that share a GPU: the log says the run checks correctness, not link speed."""
    assert soak.setting("torch", 1) == [soak.REFERENCES["torch"]]
    shared = soak.setting("torch", 2)
    assert shared[0] == soak.REFERENCES["torch"]
    assert "2 per GPU" in shared[1] and "not link speed" in shared[1]


def test_reference_nccl_refused_where_unavailable():
    """--reference nccl on a context without NCCL is a clear ValueError; the default
    there is torch."""
    class NoNccl:
        nccl_available = False
    with pytest.raises(ValueError, match="--reference torch"):
        soak.choose_reference(NoNccl(), "nccl")
    assert soak.choose_reference(NoNccl(), None) == "torch"
    assert soak.choose_reference(NoNccl(), "torch") == "torch"


def test_split_cache_entries_is_the_caches_size():
    """SPLIT_CACHE_ENTRIES is how many split tables rows.splits_tensor keeps: the first
    table survives that many distinct splits, and one more clears the cache."""
    class Ctx:
        device = "cpu"

        def __init__(self):
            self.cache = {}

        def workspace(self, key, factory):
            return self.cache.setdefault(key, factory(self))
    ctx = Ctx()
    first = rows.splits_tensor(ctx, [0, 1], [1, 0], 1)
    for i in range(1, soak.SPLIT_CACHE_ENTRIES):
        rows.splits_tensor(ctx, [i, 1], [1, i], 1)
    assert rows.splits_tensor(ctx, [0, 1], [1, 0], 1) is first
    rows.splits_tensor(ctx, [-1, 1], [1, -1], 1)
    assert rows.splits_tensor(ctx, [0, 1], [1, 0], 1) is not first


@pytest.mark.parametrize("world", [2, 4])
def test_default_run_exceeds_the_split_cache(world):
    """With the GPU defaults (100000 ops, 1M elements), each half (eager, graph) draws
    more distinct all_to_all splits on a rank than the split-table cache holds, and the
    summary line says so. Host only: the op sequence as the ranks draw it."""
    args = soak.parse(["--backend", "cuda", "--world", str(world)])
    keys = _drawn(args, world, "cuda", lambda spec: soak.split_key(spec, world - 1))
    patterns = {mode: len(k) for mode, k in keys.items()}
    assert min(patterns.values()) > soak.SPLIT_CACHE_ENTRIES, patterns
    signatures = _drawn(args, world, "cuda")        # bounded: plans are reused
    assert max(map(len, signatures.values())) <= 4 * soak.SIGNATURES + soak.A2A_SIGNATURES, \
        {mode: len(k) for mode, k in signatures.items()}
    line = soak.split_line(patterns, {("eager", "all_to_all", "push"): 1,
                                      ("graph", "all_to_all", "auto"): 1})
    assert "more than the 256 entries" in line and "eager and graph" in line, line


@pytest.mark.parametrize("world", [2, 3])
def test_catalogue(world):
    """A catalogue holds SIGNATURES distinct signatures per op and A2A_SIGNATURES
    all_to_all ones whose splits differ on every rank; its decks run every signature of
    an op once before any twice, and two catalogues drawn from one seed agree."""
    size_set = soak.sizes(1 << 20, 0)
    cat = soak.Catalogue(random.Random(1), world, size_set, ALGORITHMS)
    again = soak.Catalogue(random.Random(1), world, size_set, ALGORITHMS)
    assert cat.specs == again.specs
    assert len(cat.specs["all_to_all"]) == soak.A2A_SIGNATURES > soak.SPLIT_CACHE_ENTRIES
    for r in range(world):
        assert len({soak.split_key(s, r) for s in cat.specs["all_to_all"]}) == \
            soak.A2A_SIGNATURES
    for op in soak.OPS:
        specs = cat.specs[op]
        assert len({soak.describe(s) for s in specs}) == len(specs) > 0
        assert len(specs) == (soak.A2A_SIGNATURES if op == "all_to_all" else soak.SIGNATURES)
    g, seen = random.Random(2), []
    while sum(s["op"] == "broadcast" for s in seen) < soak.SIGNATURES:
        seen.append(cat.next(g))
    assert len({soak.describe(s) for s in seen if s["op"] == "broadcast"}) == soak.SIGNATURES


def test_reference_inputs_agree_with_the_expected_outputs():
    """soak_reference on one process: every rank's input, fed through a reference written
    differently here (stack, sum in float64, per-rank row slices), gives `expected`, for
    random ops of every kind; every rank's input differs from the others' and from the
    same op's at the next replay."""
    from bench.lab import soak_reference as ref
    world, g = 3, random.Random(7)
    size_set = soak.sizes(64, 0)
    for index in range(60):
        spec = soak.draw(g, world, size_set, ALGORITHMS)
        key = ref.op_key(0, index)                  # eager: an int
        ins = [ref.input_of(spec, r, world, key, "cpu") for r in range(world)]
        assert not torch.equal(ins[0], ins[1]) or ins[0].numel() < 4, spec
        for replay in (1, 2):                       # graphs: a device tensor per replay
            at = ref.op_key(0, index, torch.full((), replay, dtype=torch.int64))
            again = ref.input_of(spec, 0, world, at)
            assert not torch.equal(ins[0], again) or again.numel() < 4, spec
            assert torch.equal(ref.expected(spec, 1, world, at),
                               _naive(spec, [ref.input_of(spec, r, world, at)
                                             for r in range(world)], 1)), spec
        for r in range(world):
            assert torch.equal(ref.expected(spec, r, world, key, "cpu"),
                               _naive(spec, ins, r)), spec


def _naive(spec, ins, r):
    """The output on rank r from every rank's input `ins`, spelled differently from
    soak_reference.expected."""
    op, n, world = spec["op"], spec["numel"], len(ins)
    if op == "all_gather":
        return torch.cat(ins)
    if op == "broadcast":
        return ins[spec["src"]].clone()
    if op == "all_to_all":
        S, c = spec["splits"], spec["cols"]
        parts = []
        for s in range(world):
            at = sum(S[s][:r]) * c
            parts.append(ins[s][at:at + S[s][r] * c])
        return torch.cat(parts)
    blocks = [x if op == "all_reduce" else x[r * n:(r + 1) * n] for x in ins]
    stacked = torch.stack([b.double() for b in blocks])
    how = spec["reduce"]
    out = stacked.sum(0) if how == "sum" else stacked.max(0).values if how == "max" \
        else stacked.min(0).values
    return out.to(spec["dtype"])


def _lamport_over_capacity(ctx):
    """Ops that name "lamport" with a message beyond its buffers go through "auto" (the
    algorithm would raise ValueError): a heap of 4 MiB keeps them small."""
    import trident as td
    w, me = ctx.world_size, ctx.rank
    with td.init(heap_size=4 << 20, group=ctx.group) as sub:
        limits = {op: soak._lamport_limit(sub, op)
                  for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast",
                             "all_to_all")}
        n = limits["all_reduce"] // 4 + 16
        t = torch.full((n,), 1.0 + me, device=ctx.device)
        soak._trident(sub, {"op": "all_reduce", "algorithm": "lamport", "reduce": "sum"}, t, t)
        n = limits["reduce_scatter"] // 4 + 16
        out = torch.empty(n, device=ctx.device)
        soak._trident(sub, {"op": "reduce_scatter", "algorithm": "lamport", "reduce": "sum"},
                      out, torch.full((w * n,), 1.0 + me, device=ctx.device))
        n = limits["all_gather"] // 4 + 16
        gathered = torch.empty(w * n, device=ctx.device)
        soak._trident(sub, {"op": "all_gather", "algorithm": "lamport"}, gathered,
                      torch.full((n,), 1.0 + me, device=ctx.device))
        n = limits["broadcast"] // 4 + 16
        b = torch.full((n,), 1.0 + me, device=ctx.device)
        soak._trident(sub, {"op": "broadcast", "algorithm": "lamport", "src": w - 1}, b, b)
        S = [[1] * w for _ in range(w)]       # one block past the limit: rank 0 to the last
        S[0][w - 1] = limits["all_to_all"] // 16 + 1       # rows of 4 fp32
        a2a_out = torch.empty(sum(S[s][me] for s in range(w)), 4, device=ctx.device)
        soak._trident(sub, {"op": "all_to_all", "algorithm": "lamport", "splits": S, "cols": 4},
                      a2a_out, torch.full((sum(S[me]), 4), 1.0 + me, device=ctx.device))
        sub.sync()
        total = w * (w + 1) / 2
        assert (t == total).all() and (out == total).all(), (t, out)
        assert torch.equal(gathered.cpu(), torch.arange(1.0, w + 1).repeat_interleave(n))
        assert (b == w).all(), b
        senders = torch.cat([torch.full((S[s][me],), 1.0 + s) for s in range(w)])
        assert torch.equal(a2a_out.cpu(), senders[:, None].expand(-1, 4)), a2a_out
    return limits


def test_lamport_beyond_its_capacity_goes_through_auto(pool2):
    limits = pool2.run(_lamport_over_capacity)[0]
    assert limits["all_gather"] * 2 == limits["all_reduce"] == limits["reduce_scatter"], limits
    assert limits["all_gather"] == limits["broadcast"] == limits["all_to_all"], limits
