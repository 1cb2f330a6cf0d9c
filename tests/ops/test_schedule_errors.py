"""A fused-op call whose shared sizes differ between ranks never yields plausible data, in
every schedule of trident's own (issue 29's contract, issue 30): the output is poisoned
(NaN) where a wait found the mismatch, and the next call raises on every rank, naming a
call mismatch (CallMismatch, or PeerFailed quoting the peer's), then ctx.reset() gives a
context whose calls are right again."""
import pytest
import torch

from trident.runtime.errors import CallMismatch, CommTimeout, PeerFailed

from .. import algorithms
from ..conftest import WORLD_SIZES, get_pool
from .reference import assert_close, make

# one world size of the test run's (CI: 2; a GPU run at TEST_WORLDS=4: 4): the protocol
# is the same at every size, and each case costs a timeout or a reset
MULTI = [w for w in WORLD_SIZES if w >= 2][:1] or [2]
MEET = 20.0         # the ranks meet: a mismatch is found when both arrive
SHORT = 2.0         # "fused": the ranks wait on different workspaces (below)
# trident's own schedules (tests/algorithms.py), and epilogue's Lamport exchange (name:exchange)
SCHEDULES = algorithms.schedules("schedule_errors") + ["epilogue:lamport"]


@pytest.fixture(params=MULTI, ids=lambda w: f"world{w}")
def pool(request):
    return get_pool(request.param)


def _inputs(ctx, op, shared, seed):
    """a, w of `op` where `shared` is the size the ranks must agree on (rows of a per rank
    for all_gather_matmul, N for the row-parallel ops)."""
    if op == "all_gather_matmul":
        return (make((shared, 32), seed, torch.bfloat16, ctx.device),
                make((64, 32), seed + 1, torch.bfloat16, ctx.device))
    rows = 8 * ctx.world_size
    return (make((rows, 32), seed, torch.bfloat16, ctx.device),
            make((shared, 32), seed + 1, torch.bfloat16, ctx.device))


def _mismatch(ctx, op, name):
    small, large = (8, 16) if op == "all_gather_matmul" else (64, 128)
    name, _, exchange = name.partition(":")
    fn = getattr(ctx, op)
    if exchange:
        fn = lambda a, w, schedule, f=fn: f(a, w, schedule=schedule, exchange=exchange)
    for size in (small, large):         # plans and workspaces of both sizes on every rank
        fn(*_inputs(ctx, op, size, 1), schedule=name)
    ctx.sync()
    timeout = ctx.timeout_s
    ctx.set_timeout(SHORT if name == "fused" else MEET)
    try:
        out = fn(*_inputs(ctx, op, small if ctx.rank == 0 else large, 2), schedule=name)
        poisoned = bool(out.isnan().any())
        try:
            fn(*_inputs(ctx, op, small, 3), schedule=name)
            kind = None
        except Exception as exc:          # noqa: BLE001 -- the test inspects what came
            kind = type(exc).__name__
        ctx.reset()
        a, w = _inputs(ctx, op, small, 4)
        got = fn(a, w, schedule=name)
        ctx.sync()
        return poisoned, kind, bool(got.isnan().any())
    finally:
        ctx.set_timeout(timeout)


@pytest.mark.parametrize("op", ["matmul_all_reduce", "matmul_reduce_scatter",
                                "all_gather_matmul"])
def test_sizes_that_differ(pool, op):
    for name in SCHEDULES:
        if op == "all_gather_matmul" and ":" in name:      # a row-parallel exchange
            continue
        for rank, (poisoned, kind, bad_after_reset) in enumerate(pool.run(_mismatch, op, name)):
            where = f"{op} {name} rank {rank}"
            # "fused" keeps a workspace per size class, with its own flags: ranks whose
            # calls differ in size wait on flags the other never sets, and time out
            named = (CallMismatch, PeerFailed) + ((CommTimeout,) if name == "fused" else ())
            assert kind in [e.__name__ for e in named], (where, kind)
            assert not bad_after_reset, f"{where}: NaN after ctx.reset()"
            assert poisoned, f"{where}: the output of a mismatched call is not poisoned"
