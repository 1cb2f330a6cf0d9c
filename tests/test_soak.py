"""The GPU soak script (trident/bench/soak.py), run small on whatever backend the tests use:
its ops must all match torch.distributed, and a corrupted op must be caught and named."""
import os

import pytest

from trident.bench import soak

from .conftest import get_pool

OPS = int(os.environ.get("TRIDENT_SOAK_TEST_OPS", "200"))


@pytest.fixture
def pool2():
    """The session's pool of 2 ranks (the soak's world size on the lead's GPUs)."""
    return get_pool(2)


def _args(*extra):
    return soak.parse(["--ops", str(OPS), "--check-every", "50", "--graph-ops", "16",
                       "--replays", "2", "--max-numel", "512", *extra])


def test_soak_small(pool2):
    """--ops 200 (half of them from CUDA graphs on GPUs): zero mismatches on every rank."""
    args = _args()
    results = pool2.run(soak.run_rank, args)
    text, bad = soak.summary(args, results, 0.0)
    assert bad == 0, text
    r0 = results[0]
    assert r0["eager_ops"] + r0["graph_ops"] == OPS
    assert sum(r0["counts"].values()) == OPS
    assert {op for (_, op, _) in r0["counts"]} == set(soak.OPS), text


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


def test_main_writes_the_log(tmp_path):
    """The command line end to end (its own ranks, through trident.launch), tiny."""
    log = tmp_path / "soak.log"
    argv = ["--ops", "10", "--world", "2", "--max-numel", "64", "--no-graph", "--log", str(log)]
    assert soak.main(argv) == 0
    text = log.read_text()
    assert "command: python -m trident.bench.soak --ops 10" in text
    assert "mismatches: 0" in text
