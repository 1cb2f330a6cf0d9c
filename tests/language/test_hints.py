"""The CPU emulation checks tl.multiple_of: a false alignment promise is a misaligned
address crash on a GPU, so it must fail on the CPU too (trident/runtime/emulation.py)."""
import pytest
import torch
import triton
import triton.language as tl

from trident.runtime import emulation
from trident.runtime._env import INTERPRET

pytestmark = pytest.mark.skipif(not INTERPRET, reason="checks the interpreter's hints")


@triton.jit
def _hinted_copy(dst, src, offset, ALIGN: tl.constexpr):
    offs = tl.arange(0, 16)
    at = tl.multiple_of(tl.load(offset), ALIGN)
    tl.store(dst + offs, tl.load(src + at + offs))


def test_false_multiple_of_raises_true_one_passes():
    emulation.install()
    src, dst = torch.arange(64, dtype=torch.float32), torch.zeros(16)
    _hinted_copy[(1,)](dst, src, torch.tensor([32]), ALIGN=16)
    assert torch.equal(dst, src[32:48])
    with pytest.raises(Exception, match=r"tl.multiple_of\(16\) is false: 33"):
        _hinted_copy[(1,)](dst, src, torch.tensor([33]), ALIGN=16)
