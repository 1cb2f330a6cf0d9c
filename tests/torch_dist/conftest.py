"""Rank pools whose default process group is backend "trident" (td.launch's
dist_backend="trident"): each world size's ranks start once for this folder, and every
test runs many checks in them. Worlds 2 and 4 (those of TRIDENT_TEST_WORLD_SIZES among
them, when it is set)."""
import os

import pytest

from trident.runtime.launch import RankPool, default_backend

from ..conftest import WORLD_SIZES

BACKEND = default_backend()
WORLDS = [w for w in WORLD_SIZES if w in (2, 4)] or [2]


@pytest.fixture(scope="package", params=WORLDS, ids=lambda w: f"world{w}")
def tpool(request):
    """A RankPool of each world whose default group is backend "trident": `tpool.run(fn)`
    runs fn(ctx) on every rank, ctx being that group's trident context."""
    heap = int(os.environ.get("TRIDENT_TEST_HEAP_SIZE",
                              1 << 30 if BACKEND == "cuda" else 64 << 20))
    with RankPool(request.param, backend=BACKEND, heap_size=heap, timeout=60.0,
                  run_timeout=900.0, dist_backend="trident") as pool:
        yield pool
