"""The large-message knobs (keyword options beyond block/programs: warps, all_gather
pull's order, broadcast relay's depth/chunk) and the push_direct all_gather, against
plain-torch references; bad knobs raise; the sweep (bench/lab/sweep.py) runs every
variant of its grid at a tiny size and finds them all correct."""
import pytest
import torch

from .refs import BLOCK, assert_equal, rank_inputs, reduce_ref
from .test_heap_offsets import LAYOUTS, _at_bytes

# (label, algorithm, knobs); block/programs forced small so that programs loop
AG = [("pull order=block", "pull", dict(order="block", block=BLOCK)),
      ("pull order=block p3", "pull", dict(order="block", block=16, programs=3)),
      ("pull order=peer w4", "pull", dict(order="peer", warps=4, block=BLOCK)),
      ("push_direct", "push_direct", dict(block=BLOCK)),
      ("push_direct default", "push_direct", {}),
      ("push_direct p3 w16", "push_direct", dict(block=16, programs=3, warps=16))]


def _all_gather_knobs(ctx):
    w, r = ctx.world_size, ctx.rank
    for i, (dtype, shape, sym) in enumerate(((torch.bfloat16, (300,), True),
                                             (torch.int8, (5, 3), False),   # int8 words
                                             (torch.float32, (37, 2), True))):
        for label, alg, kw in AG:
            xs = rank_inputs(w, shape, dtype, seed=60 + i)
            out = ctx.zeros(w * shape[0], *shape[1:], dtype=dtype) if sym else \
                torch.zeros(w * shape[0], *shape[1:], dtype=dtype, device=ctx.device)
            for _ in range(2):                     # back to back, same plan
                ctx.all_gather(out, xs[r].to(ctx.device), algorithm=alg, **kw)
            ctx.sync()
            assert_equal(out, torch.cat(xs), f"{label} {dtype} {shape} sym={sym}")
            if sym:
                ctx.free(out)


def _push_direct_offsets(ctx):
    """push_direct writes peers' outputs wherever they lie on their heaps (vector, scalar
    and mixed shifts), and in place (the input a view of the output)."""
    w, r = ctx.world_size, ctx.rank
    for layout in sorted(LAYOUTS):
        for n in (301, 64):
            blocks = rank_inputs(w, (n,), torch.float32, seed=n)
            out, keep = _at_bytes(ctx, torch.zeros(w * n), layout)
            ctx.all_gather(out, blocks[r].to(ctx.device), algorithm="push_direct", block=BLOCK)
            ctx.sync()
            assert_equal(out, torch.cat(blocks), f"push_direct {layout} n={n}")
            ctx.free(keep)
    n = 300
    blocks = rank_inputs(w, (n,), torch.bfloat16, seed=5)
    out = ctx.zeros(w * n, dtype=torch.bfloat16)
    mine = out[r * n:(r + 1) * n]
    mine.copy_(blocks[r])
    ctx.all_gather(out, mine, algorithm="push_direct", block=BLOCK)
    ctx.sync()
    assert_equal(out, torch.cat(blocks), "push_direct in place")
    ctx.free(out)


def _reduction_knobs(ctx):
    w, r = ctx.world_size, ctx.rank
    for i, kw in enumerate((dict(warps=4), dict(warps=16, programs=3, block=16))):
        xs = rank_inputs(w, (301,), torch.bfloat16, seed=70 + i)
        t = ctx.empty(301, dtype=torch.bfloat16).copy_(xs[r])
        ctx.all_reduce(t, algorithm="two_shot", **kw)
        ctx.sync()
        assert_equal(t, reduce_ref(xs, "sum"), f"two_shot {kw}")
        ctx.free(t)
        big = rank_inputs(w, (w * 129,), torch.float32, seed=80 + i)
        out = torch.empty(129, device=ctx.device)
        ctx.reduce_scatter(out, big[r].to(ctx.device), algorithm="pull", **kw)
        ctx.sync()
        assert_equal(out, reduce_ref(big, "sum")[r * 129:(r + 1) * 129], f"rs pull {kw}")


def _a2a_and_relay_knobs(ctx):
    w, r = ctx.world_size, ctx.rank
    rows = 4 * w
    xs = rank_inputs(w, (rows, 6), torch.bfloat16, seed=90)
    expected = torch.cat([x.view(w, 4, 6)[r] for x in xs])
    for kw in (dict(warps=4), dict(warps=16, programs=5, block=16)):
        out = ctx.zeros(rows, 6, dtype=torch.bfloat16)
        ctx.all_to_all(out, xs[r].to(ctx.device), algorithm="push", **kw)
        ctx.sync()
        assert_equal(out, expected, f"a2a push {kw}")
        ctx.free(out)
    src = w - 1
    for n, kw in ((1000, dict(depth=1)), (1000, dict(depth=16, block=16)),
                  (1000, dict(chunk=32, block=16, programs=3, warps=4)),
                  (77, dict(depth=8))):
        x = rank_inputs(w, (n,), torch.float32, seed=n)[src]
        t = torch.zeros(n, device=ctx.device) if r != src else x.clone().to(ctx.device)
        ctx.broadcast(t, src, algorithm="relay", **kw)
        ctx.sync()
        assert_equal(t, x, f"relay n={n} {kw}")


def test_all_gather_knobs(pool):
    pool.run(_all_gather_knobs)


def test_push_direct_offsets(pool):
    pool.run(_push_direct_offsets)


def test_reduction_knobs(pool):
    pool.run(_reduction_knobs)


def test_a2a_and_relay_knobs(pool):
    pool.run(_a2a_and_relay_knobs)


def _bad_knobs(ctx):
    t = torch.ones(64, device=ctx.device)
    with pytest.raises(ValueError, match="unknown option"):
        ctx.all_reduce(t, algorithm="two_shot", chunk=4)
    with pytest.raises(ValueError, match="unknown option"):
        ctx.all_reduce(t, algorithm="one_shot", warps=4)
    # a misspelt argument of the op (torch's `root` for trident's `src`) says so
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['root'\].*not broadcast's own"):
        ctx.broadcast(t, root=0)
    with pytest.raises(ValueError, match="nccl takes no options" if ctx.nccl_available
                       else "ranks share one GPU"):
        ctx.broadcast(t, 0, algorithm="nccl", depth=4)
    with pytest.raises(ValueError, match="warps must be one of"):
        ctx.all_reduce(t, algorithm="two_shot", warps=3)
    with pytest.raises(ValueError, match="order must be one of"):
        ctx.all_gather(torch.empty(64 * ctx.world_size, device=ctx.device), t,
                       algorithm="pull", order="diagonal")
    with pytest.raises(ValueError, match="depth must be"):
        ctx.broadcast(t, 0, algorithm="relay", depth=0)
    # the same where no kernel runs (an empty tensor; at one rank, every call above)
    empty = torch.ones(0, device=ctx.device)
    with pytest.raises(ValueError, match="warps must be one of"):
        ctx.all_reduce(empty, algorithm="two_shot", warps=3)
    with pytest.raises(ValueError, match="chunk must be a positive multiple of the block"):
        ctx.broadcast(empty, 0, algorithm="relay", chunk=5)
    with pytest.raises(ValueError, match="all_to_all: block must be a power of two"):
        ctx.all_to_all(empty, empty.clone(), algorithm="push", block=48)
    ctx.barrier()


def test_bad_knobs(pool):
    pool.run(_bad_knobs)


def _sweep_tiny(ctx):
    from bench.lab import sweep
    timing = lambda size: {"calls": 1, "reps": 1, "warmup": 0}     # noqa: E731
    rows = sweep.measure(ctx, list(sweep.GRID), [2048], timing)
    return rows


def test_sweep_runs_every_variant():
    from bench.lab import sweep
    from ..conftest import get_pool, nccl_available
    if not nccl_available(get_pool(2)):
        pytest.skip("the sweep checks every variant against NCCL, which ranks sharing a GPU "
                    "cannot run")
    from trident.runtime.launch import default_backend
    rows = get_pool(2).run(_sweep_tiny)[0]
    gpu = default_backend() == "cuda"     # on GPUs, variants limited to large sizes drop out
    assert len(rows) == sum(len(sweep.variants(op, 2048, gpu)) + 1 for op in sweep.GRID)
    assert all(r["ok"] and r["graph_us"] for r in rows), [r for r in rows if not r["ok"]]
    best = sweep.suggest(rows)
    assert set(best) == set(sweep.GRID) and all("2 KiB" in v for v in best.values())
