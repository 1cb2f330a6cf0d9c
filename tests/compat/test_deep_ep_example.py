"""examples/deep_ep_moe.py at 2 ranks, with uninitialised memory poisoned
(tests/moe/poison.py): the MoE layer written against DeepEP's API matches the dense torch
layer on both paths (the example checks it), and reads no element nobody wrote."""
import pytest

from tests.conftest import WORLD_SIZES, get_pool

from ..examples import load_example
from ..moe.poison import poisoned


def _run(ctx):
    with poisoned(ctx):
        return load_example("deep_ep_moe").main(ctx)


@pytest.mark.skipif(2 not in WORLD_SIZES, reason="runs at world size 2")
def test_deep_ep_example_matches_dense_layer():
    for errors in get_pool(2).run(_run):
        assert set(errors) == {"decode", "prefill"}
        assert max(errors.values()) < 2e-2
