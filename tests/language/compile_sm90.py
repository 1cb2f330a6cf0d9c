"""Moved to tests/compile/sm90.py (every kernel of the package, one list). Kept only for
tests/ccl/test_all_to_all.py, whose own sm_90 check that list now covers."""
from tests.compile.sm90 import compile_ptx  # noqa: F401  (sets the GPU mode first)
