"""The rank pools of tests/compat: every test world size from 2 up (DeepEP's calls need
peers), started once per session by tests/conftest.py's get_pool."""
import pytest

from tests.conftest import WORLD_SIZES, get_pool


@pytest.fixture(params=[w for w in WORLD_SIZES if w >= 2], ids=lambda w: f"world{w}")
def pool2(request):
    return get_pool(request.param)
