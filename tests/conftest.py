"""Rank pools shared by the whole session: each world size's processes start once.

On the CPU emulation the default world sizes are 1, 2 and 4; on GPUs, 2 and every GPU
visible, and on a machine with one GPU 1, 2 and 4 (ranks share the GPU under MPS, see
trident/runtime/placement.py). TRIDENT_TEST_WORLD_SIZES=2,3,4 overrides. A world that is
not a power of two (padding lanes, uneven splits) runs where it covers the most for its
time: the fuzz suites (tests/fuzz, worlds 2 and 3 unless TRIDENT_FUZZ_WORLD_SIZES says
otherwise: every collective, fused op and MoE path on random shapes). World 3 ran in
every pool test until the CPU suite passed 40 minutes on 2 cores (docs/test-times.md).
"""
import os

import pytest

from trident.runtime.launch import RankPool, default_backend

BACKEND = default_backend()


def _default_world_sizes() -> list[int]:
    if BACKEND == "cuda":
        import torch
        n = torch.cuda.device_count()
        if n == 1:
            return [1, 2, 4]
        return sorted({w for w in (2, n) if 2 <= w <= n})
    return [1, 2, 4]


def _world_sizes() -> list[int]:
    if os.environ.get("TRIDENT_TEST_WORLD_SIZES"):
        return [int(w) for w in os.environ["TRIDENT_TEST_WORLD_SIZES"].split(",")]
    return _default_world_sizes()


WORLD_SIZES = _world_sizes()
# Tests that use no pool of the test world sizes (a compile check, a fixed 2-rank job) would
# run once per world in a suite that is run world by world (bench/gpu_suite.sh: one pytest
# per file and world): they run where the world list includes this one, the smallest
# default world, and are skipped, saying so, elsewhere.
ONCE_WORLD = min(_default_world_sizes())
once = pytest.mark.skipif(
    ONCE_WORLD not in WORLD_SIZES,
    reason=f"independent of the world size: runs once, with the world sizes that include "
           f"{ONCE_WORLD} (TRIDENT_TEST_WORLD_SIZES={','.join(map(str, WORLD_SIZES))})")
_pools: dict[int, RankPool] = {}


def get_pool(world_size: int) -> RankPool:
    pool = _pools.get(world_size)
    if pool is None or pool.closed:
        heap = int(os.environ.get("TRIDENT_TEST_HEAP_SIZE", 1 << 30 if BACKEND == "cuda" else 64 << 20))
        pool = _pools[world_size] = RankPool(world_size, backend=BACKEND, heap_size=heap,
                                             timeout=60.0, run_timeout=900.0)
    return pool


def pool_worlds(worlds) -> list[int]:
    """The world sizes of a module that names its own (`POOL_WORLDS = pool_worlds(...)`):
    those, or the ones of them TRIDENT_TEST_WORLD_SIZES lists where it is set."""
    if os.environ.get("TRIDENT_TEST_WORLD_SIZES"):
        return [w for w in worlds if w in WORLD_SIZES]
    return list(worlds)


def pytest_generate_tests(metafunc):
    """`pool` runs at each test world size, or at the module's POOL_WORLDS (pool_worlds),
    unless the test parametrizes it itself (indirect=True) or its module defines its own
    `pool` fixture (with its own worlds)."""
    if getattr(metafunc.module, "pool", None) is not None:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        if "pool" in ([n.strip() for n in names.split(",")] if isinstance(names, str) else names):
            return
    if "pool" in metafunc.fixturenames:
        worlds = getattr(metafunc.module, "POOL_WORLDS", WORLD_SIZES)
        metafunc.parametrize("pool", worlds, indirect=True, ids=lambda w: f"world{w}")


@pytest.fixture
def pool(request) -> RankPool:
    """A RankPool of each test world size: `pool.run(fn, *args)` runs fn(ctx, *args) on all ranks."""
    return get_pool(request.param)


def _nccl_available(ctx) -> bool:
    return ctx.nccl_available


def nccl_available(pool: RankPool) -> bool:
    """Whether the pool's ranks can run the "nccl" algorithm (not where they share a GPU)."""
    return all(pool.run(_nccl_available))


def pytest_addoption(parser):
    parser.addoption("--cases", type=int, default=None,
                     help="fuzz cases per op family in tests/fuzz (default: the CI seed set)")


def pytest_sessionfinish(session, exitstatus):
    from .nodes import close_pools
    for p in _pools.values():
        p.close()
    _pools.clear()
    close_pools()
