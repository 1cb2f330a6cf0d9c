"""The Gluon all-gather (trident/ccl/all_gather/gluon.py) against torch.cat of every rank's
random input: odd sizes, several dtypes, plain and heap tensors, in place, back to back.
On the CPU emulation (Gluon mapped onto the interpreter, trident/runtime/emulation.py) at worlds
2 and 3, also under the race detector; on GPUs at worlds 2 and 4."""
import pytest
import torch
from triton.experimental.gluon import language as gl

import trident.language as tdl
from trident import sanitize
from trident.language.gluon import jit

from tests.conftest import BACKEND, WORLD_SIZES, get_pool
from .refs import BLOCK, assert_equal, place, rank_inputs

GLUON_WORLDS = [w for w in ((2, 3) if BACKEND == "cpu" else (2, 4)) if w in WORLD_SIZES]

# (dtype, per-rank shape, inp on the heap, block, programs)
CASES = [
    (torch.bfloat16, (37,), False, BLOCK, None),        # odd: scalar accesses, 1 program
    (torch.float32, (300, 3), True, BLOCK, 3),          # 15 tiles over 3 programs
    (torch.int8, (5, 3), False, None, None),            # 15 bytes: moved as int8
    (torch.float16, (1030,), True, None, None),         # default block, several tiles
]


@pytest.fixture(params=GLUON_WORLDS, ids=lambda w: f"world{w}")
def gpool(request):
    return get_pool(request.param)


def _cases(ctx, cases):
    w = ctx.world_size
    for i, (dtype, shape, sym, block, programs) in enumerate(cases):
        xs = [rank_inputs(w, shape, dtype, seed=70 + i), rank_inputs(w, shape, dtype, seed=90 + i)]
        outs = [torch.empty(w * shape[0], *shape[1:], dtype=dtype, device=ctx.device)
                for _ in xs]
        for x, out in zip(xs, outs):          # back to back, no sync: epochs and halves
            ctx.all_gather(out, place(ctx, x[ctx.rank], sym), algorithm="gluon", block=block,
                           programs=programs)
        ctx.sync()
        for x, out in zip(xs, outs):
            assert_equal(out, torch.cat(x), f"gluon {dtype} {shape}")
    # in place: the input is this rank's segment of a heap output
    x = rank_inputs(w, (45,), torch.float32, seed=5)
    out = ctx.empty(w * 45, dtype=torch.float32)
    out[ctx.rank * 45:(ctx.rank + 1) * 45].copy_(x[ctx.rank].to(ctx.device))
    ctx.all_gather(out, out[ctx.rank * 45:(ctx.rank + 1) * 45], algorithm="gluon", block=16)
    ctx.sync()
    assert_equal(out, torch.cat(x), "gluon in place")
    ctx.free(out)
    return True


def test_all_gather_gluon(gpool):
    assert all(gpool.run(_cases, CASES))


def _bad_option(ctx):
    inp = torch.ones(8, device=ctx.device)
    out = torch.empty(8 * ctx.world_size, device=ctx.device)
    with pytest.raises(ValueError, match="unknown option"):
        ctx.all_gather(out, inp, algorithm="gluon", order="block")
    with pytest.raises(ValueError, match="warps must be one of"):
        ctx.all_gather(out, inp, algorithm="gluon", warps=3)
    return True


def test_all_gather_gluon_bad_options(gpool):
    assert all(gpool.run(_bad_option))


# ---------------------------------------------------------------- under the race detector
sanitized = pytest.mark.skipif(BACKEND != "cpu", reason="the sanitizer runs on the CPU "
                               "emulation only")


def _clean(ctx, seed):
    w, r = ctx.world_size, ctx.rank
    xs = rank_inputs(w, (33,), torch.float32, seed=seed)
    out = torch.empty(33 * w)
    with sanitize.sanitizing(ctx, seed):
        for _ in range(2):                      # back to back: epochs, scratch halves
            ctx.all_gather(out, xs[r].clone(), algorithm="gluon", block=16, programs=2)
        ctx.barrier()
    assert_equal(out, torch.cat(xs), "gluon under the sanitizer")
    return True


@sanitized
def test_all_gather_gluon_runs_clean(gpool):
    assert all(gpool.run(_clean, 4))


@jit
def _put_unordered(buf, val, out, heap_bases, rank, n, BLOCK: gl.constexpr):
    """Rank 0 stores into rank 1's `buf` while rank 1 reads it, with no signal between."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = gl.arange(0, BLOCK, layout)
    mask = offs < n
    if rank == 0:
        tdl.store(buf + offs, gl.load(val + offs, mask=mask), 0, 1, heap_bases, mask=mask)
    if rank == 1:
        gl.store(out + offs, gl.load(buf + offs, mask=mask), mask=mask)


def _planted(ctx, seed):
    val = torch.randn(20)
    buf = ctx.zeros(20)
    out = torch.zeros(20)
    ctx.barrier()
    with sanitize.sanitizing(ctx, seed):
        _put_unordered[(1,)](buf, val, out, ctx.heap_bases, ctx.rank, 20, BLOCK=32)
        try:
            ctx.barrier()
        except sanitize.RaceError as e:
            return str(e)
    return None


@sanitized
def test_planted_gluon_race_is_reported(gpool):
    """The sanitizer sees a Gluon kernel's accesses: they reach the interpreter's memory ops
    through the emulation's mapping of Gluon."""
    reports = gpool.run(_planted, 1)
    assert all(msg is not None and "race" in msg and "_put_unordered" in msg for msg in reports), \
        reports
