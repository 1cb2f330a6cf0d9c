"""A rank in a host-side call (ctx.barrier(), ctx.close(), the torch backend's
dist.destroy_process_group()) while its peers make a collective (issue 29): no rank may
return data, or return normally, from a call that no peer made. Before, the peers' kernels
waited out the device timeout and raised CommTimeout, the rank in the host call waited out
the host timeout (HostTimeout, the group unusable afterwards), and nothing named the two
calls. Now the peers' waits find the rank in its host call (language/sync.py, "A peer in a
host-side call"), their outputs are poisoned, and every rank raises CallMismatch
quickly, naming both calls; a barrier on every rank before ctx.reset() raises at once;
reset() then gives a context whose next call is right, and a peer of a rank that closed
closes at once.

Each case runs on a context of its own, over a gloo group of its own, so that a failure
(a host timeout) cannot break the pool's group; worlds 2 and 3, one pool run per world."""
import time

import pytest
import torch
import torch.distributed as dist

import trident as td
from trident.runtime.errors import CallMismatch

from ..conftest import WORLD_SIZES, get_pool

WORLDS = [w for w in WORLD_SIZES if w in (2, 3)] or [2]
TIMEOUT = 20.0       # the device timeout of each case's context: a case that waits it out fails
QUICK = 5.0          # seconds within which every rank must have raised
N = 8                # elements per rank
OPS = ("all_gather", "all_to_all", "all_reduce", "broadcast", "reduce_scatter",
       "device_barrier", "moe_dispatch")
# (rank 0's host call, the peers' op); "cold": the peers' op never ran on the context
CASES = ([("barrier", op) for op in OPS]
         + [("close", op) for op in OPS if op != "device_barrier"]
         + [("close", "all_gather cold")])
TORCH_CASES = ("all_gather_into_tensor", "all_to_all_single", "all_reduce")


@pytest.fixture(params=WORLDS, ids=lambda w: f"world{w}")
def pool(request):
    return get_pool(request.param)


def _moe(ctx):
    return td.ExpertParallel(ctx, 2 * ctx.world_size, 2, 16, 4, dtype=torch.float32)


def _op(ctx, op, ep=None):
    """One call of `op` on `ctx`; returns the outputs it wrote (None for a barrier)."""
    dev, w = ctx.device, ctx.world_size
    if op == "all_gather":
        out = torch.zeros(N * w, device=dev)
        ctx.all_gather(out, torch.ones(N, device=dev))
        return [out]
    if op == "all_to_all":
        out = torch.zeros(N * w, device=dev)
        ctx.all_to_all(out, torch.ones(N * w, device=dev))
        return [out]
    if op == "all_reduce":
        t = torch.ones(N, device=dev)
        ctx.all_reduce(t)
        return [t]
    if op == "broadcast":
        t = torch.full((N,), float(ctx.rank), device=dev)
        ctx.broadcast(t, 0)
        return [t]
    if op == "reduce_scatter":
        out = torch.zeros(N, device=dev)
        ctx.reduce_scatter(out, torch.ones(N * w, device=dev))
        return [out]
    if op == "device_barrier":
        ctx.device_barrier()
        return None
    torch.manual_seed(ctx.rank)
    idx = torch.stack([torch.randperm(ep.num_experts)[:2] for _ in range(4)]).to(dev)
    d = ep.dispatch(torch.randn(4, 16, device=dev), idx)
    return [d.expert_x, d.expert_num_tokens]


def _poisoned(outs) -> bool:
    """NaN (floats) or all bits set (integers) in every output: what a failed call leaves
    in the parts it would have received (a rank's own block of an all_gather is its own)."""
    return all(bool(t.isnan().any()) if t.is_floating_point() else bool((t == -1).any())
               for t in outs)


def _case(ctx, call, op):
    """Rank 0 makes host call `call` while the others call `op` (warm unless 'cold'):
    (what each rank raised, its message, seconds, outputs returned before it, all poisoned)."""
    op, cold = op.split()[0], op.endswith("cold")
    sub = td.init(heap_size=8 << 20, timeout=TIMEOUT, group=dist.new_group(backend="gloo"))
    ep = _moe(sub) if op == "moe_dispatch" else None
    if not cold:
        _op(sub, op, ep)
        sub.sync()
    sub.barrier()
    returned, poisoned, kind, text = 0, True, None, ""
    t0 = time.perf_counter()
    try:
        if sub.rank == 0:
            getattr(sub, call)()
        else:
            for _ in range(3):           # a failed call poisons its outputs; the next raises
                outs = _op(sub, op, ep)
                returned += 1
                poisoned &= outs is None or _poisoned(outs)
            sub.sync()
    except Exception as exc:             # noqa: BLE001 -- the test inspects what came
        kind, text = type(exc).__name__, str(exc)
    took = time.perf_counter() - t0
    after = None
    if call == "barrier":
        # out of step until reset: a barrier that every rank makes next raises at once
        # on every rank (no host timeout, which would leave the group unusable)
        t1 = time.perf_counter()
        try:
            sub.barrier()
            again = "returned"
        except Exception as exc:         # noqa: BLE001
            again = type(exc).__name__
        again = (again, time.perf_counter() - t1)
        sub.reset()                      # reset repairs: the next correct call is right
        t = torch.ones(N, device=sub.device)
        sub.all_reduce(t)
        after = (bool((t == sub.world_size).all()), *again)
    t1 = time.perf_counter()
    if ep is not None and call != "close":
        ep.close()
    sub.close()                          # a peer of a rank that closed: at once
    return kind, text, took, returned, poisoned, after, time.perf_counter() - t1


def _torch_case(ctx, op):
    """Rank 0 destroys a "trident" process group while the others call `op` on it."""
    from trident.torch.backend import Options
    g = dist.new_group(backend="trident", pg_options=Options(heap_size=8 << 20, timeout=TIMEOUT))
    w, dev = ctx.world_size, ctx.device

    def call():
        if op == "all_gather_into_tensor":
            out = torch.zeros(N * w, device=dev)
            dist.all_gather_into_tensor(out, torch.ones(N, device=dev), group=g)
        elif op == "all_to_all_single":
            out = torch.zeros(N * w, device=dev)
            dist.all_to_all_single(out, torch.ones(N * w, device=dev), group=g)
        else:
            out = torch.ones(N, device=dev)
            dist.all_reduce(out, group=g)
        return out

    call()
    dist.barrier(group=g)
    returned, poisoned, kind, text = 0, True, None, ""
    t0 = time.perf_counter()
    try:
        if ctx.rank == 0:
            dist.destroy_process_group(g)
        else:
            for _ in range(3):
                out = call()
                returned += 1
                poisoned &= bool(out.isnan().any())
            g.context().sync()
    except Exception as exc:             # noqa: BLE001
        kind, text = type(exc).__name__, str(exc)
    took = time.perf_counter() - t0
    t1 = time.perf_counter()
    if ctx.rank != 0:
        dist.destroy_process_group(g)
    return kind, text, took, returned, poisoned, None, time.perf_counter() - t1


def _all_cases(ctx):
    out = {}
    for call, op in CASES:
        out[f"{call} / {op}"] = _case(ctx, call, op)
    for op in TORCH_CASES:
        out[f"destroy_process_group / {op}"] = _torch_case(ctx, op)
    return out


def test_a_rank_in_a_host_call_meets_no_collective(pool):
    results = pool.run(_all_cases)
    bad = []
    for name in results[0]:
        call, op = name.split(" / ")
        described = {"barrier": "ctx.barrier()", "close": "ctx.close()",
                     "destroy_process_group": "dist.destroy_process_group()"}[call]
        for rank, r in enumerate(results):
            kind, text, took, returned, poisoned, after, closed = r[name]
            line = f"{name}, rank {rank}: {kind} in {took:.2f} s: {text[:300]}"
            if kind != CallMismatch.__name__:
                bad.append(f"{line} (expected CallMismatch)")
            elif described not in text or op.split()[0].replace("_single", "").replace(
                    "_into_tensor", "").replace("moe_", "") not in text:
                bad.append(f"{line} (the message must name both calls)")
            if took > QUICK:
                bad.append(f"{line} (not quick)")
            if not poisoned:
                bad.append(f"{line} (a call returned unpoisoned outputs, {returned} returned)")
            if after is not None:
                right, again, again_s = after
                if again != CallMismatch.__name__ or again_s > QUICK:
                    bad.append(f"{name}, rank {rank}: the barrier before reset() gave "
                               f"{again} in {again_s:.2f} s (expected CallMismatch, quickly)")
                if not right:
                    bad.append(f"{name}, rank {rank}: the call after reset() is wrong")
            if closed > QUICK:
                bad.append(f"{name}, rank {rank}: close took {closed:.2f} s")
    assert not bad, "\n".join(bad)


def _header_sized_nccl_all_gather(ctx):
    """Rank 0 in ctx.barrier(), the others in a torch.distributed all_gather on the
    context's group (what the "nccl" algorithm runs) of exactly the size of the host
    exchange's header. The barrier went over the same group, so the two paired: the peers
    returned rank 0's header as their data, with no error. Now the barrier goes through the
    store: the peers' collective meets nothing and raises when the group gives up."""
    import datetime
    g = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=4))
    sub = td.init(heap_size=8 << 20, timeout=3.0, group=g)
    n = 16                                        # int64 words per rank: the header's size

    def gather():
        # what the "nccl" algorithm and the torch backend's fallbacks do: a torch.distributed
        # collective on the context's group (gloo, host tensors: it runs where ranks share
        # a GPU too, where the "nccl" algorithm is refused)
        out = torch.zeros(n * sub.world_size, dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.ones(n, dtype=torch.int64), group=g)
        return out

    gather()
    sub.barrier()
    try:
        if sub.rank == 0:
            sub.barrier()
            result = "returned"
        else:
            out = gather()
            result = "returned " + ("ones" if bool((out == 1).all()) else "other data")
    except Exception as exc:             # noqa: BLE001
        result = type(exc).__name__
    try:
        sub.close()
    except Exception:                    # noqa: BLE001 -- the group failed, as it must
        pass
    return result


@pytest.mark.parametrize("world", [2])
def test_a_host_exchange_never_pairs_with_a_collective(world):
    results = get_pool(world).run(_header_sized_nccl_all_gather)
    assert not any(r.startswith("returned") for r in results), results
