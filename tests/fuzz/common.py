"""What the fuzz suites share: how many cases, which world sizes, and running a batch of
cases on every rank of a pool so that one failing check does not stop the others.

Every rank draws the same case from the same seed (so the ranks make the same calls)
and builds every rank's input, so that it checks its result against plain torch on the
gathered inputs. A check that fails is recorded with its case and seed and the batch goes
on (the ranks stay in step); an exception gets the case as a note and stops the batch.
Replay one case: `pytest tests/fuzz -k <family> --cases N` runs seeds 0..N-1.
"""
import os

import pytest

from ..conftest import pool_worlds

WORLD_SIZES = [int(w) for w in os.environ.get("TRIDENT_FUZZ_WORLD_SIZES", "2,3").split(",")]
# the fuzz modules' pools: their own worlds (3 among them, which the other tests' pools
# lack: tests/conftest.py), not the suite's
POOL_WORLDS = pool_worlds(WORLD_SIZES)
BATCH = 25        # cases per pool.run call


def num_cases(request, default: int) -> int:
    return request.config.getoption("--cases") or default


def fuzzed_worlds(default: str) -> list[int]:
    """The world sizes a suite fuzzes: TRIDENT_FUZZ_WORLD_SIZES if set, else `default`
    (e.g. "2,3,4" for a suite that is cheap enough at 4 ranks)."""
    return [int(w) for w in os.environ.get("TRIDENT_FUZZ_WORLD_SIZES", default).split(",")]


def skip_unless_fuzzed_world(pool, worlds=None) -> None:
    worlds = WORLD_SIZES if worlds is None else worlds
    if pool.world_size not in worlds:
        pytest.skip(f"fuzzing runs at world sizes {worlds} (TRIDENT_FUZZ_WORLD_SIZES)")


def run_cases(ctx, run_one, seeds) -> dict:
    """run_one(ctx, seed) -> list of (got, expected, what, tol) to compare once the device
    work of the whole batch is done (cases run back to back, without a sync), or the
    string 'rejected: ...'. tol is a tolerance (torch.testing.assert_close's rtol and
    atol), or a function check(got_on_cpu, expected) that raises AssertionError.
    Returns {'failures': [...], 'rejected': [...], 'cases': n}."""
    import torch
    failures, rejected, checks = [], [], []
    for seed in seeds:
        try:
            result = run_one(ctx, seed)
        except Exception as exc:
            exc.add_note(f"fuzz case seed {seed} on rank {ctx.rank} of {ctx.world_size}")
            raise
        if isinstance(result, str):
            rejected.append(f"seed {seed}: {result}")
        else:
            checks.extend((seed, *c) for c in result)
    ctx.sync()
    for seed, got, expected, what, tol in checks:
        got = got.detach().cpu()
        try:
            if callable(tol):
                tol(got, expected)
            elif got.dtype.is_floating_point:
                torch.testing.assert_close(got.float(), expected.float(), rtol=tol, atol=tol)
            else:
                assert torch.equal(got, expected), "values differ"
        except AssertionError as exc:
            failures.append(f"rank {ctx.rank} seed {seed}: {what}: {str(exc)[:400]}")
    ctx.barrier()
    return {"failures": failures, "rejected": rejected, "cases": len(list(seeds))}


def run_family(pool, fn, n: int, *args, batch: int = BATCH) -> dict:
    """Seeds 0..n-1 in batches of `batch` (one pool.run each); asserts that no check
    failed; returns the rejections."""
    failures, rejected = [], set()
    for start in range(0, n, batch):
        seeds = range(start, min(n, start + batch))
        for result in pool.run(fn, list(seeds), *args):
            failures += result["failures"]
            rejected.update(result["rejected"])
    assert not failures, f"{len(failures)} fuzz checks failed:\n" + "\n".join(failures[:20])
    return sorted(rejected)
