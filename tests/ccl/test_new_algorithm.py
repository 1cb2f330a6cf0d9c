"""A new algorithm is its file and one line of trident/ccl/registry.py (docs/design.md,
"Adding an algorithm"), and the tests pick it up. Shown with a throwaway all_gather: the
test writes its kernel file (KERNEL_FILE, into tmp_path), imports it as
trident.ccl.all_gather.throwaway and adds LINE to the registry (tests/algorithms.py
`declared`) -- in this process and, inside the function the pool runs, in each rank
process -- and takes all of it away again at the end."""
import contextlib
import importlib.util
import sys

import pytest

from trident.ccl import registry

from .. import algorithms
from ..compile import test_sm90
from . import test_all_gather, test_graph_replay
from .test_registry import check_declaration

NAME = "throwaway"
MODULE = f"trident.ccl.all_gather.{NAME}"
# its registry line: no knobs; 2 * world * message bytes of heap scratch; opt-in
LINE = registry.Algorithm("all_gather", NAME, f"all_gather.{NAME}", (), "message", auto=False)

KERNEL_FILE = '''"""A throwaway all-gather: push's protocol (ccl/device.py's push skeleton) with the
stores to the peers written out, the peers taken in the reverse order."""
import triton
import triton.language as tl

import trident.language as tdl
from trident.ccl import common
from trident.ccl.device import OP_ALL_GATHER, gather_slots, push_begin, push_exchange


@triton.jit
def _throwaway_kernel(out, inp, scratch, flags, sync, ctrl, heap_bases, trace_buf, rank,
                      world_size, n, stride, half, fp, BLOCK: tl.constexpr,
                      TRACE: tl.constexpr):
    epoch, slots, t0 = push_begin(sync, scratch, half, TRACE)
    for blk in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(inp + offs, mask=mask)
        tl.store(out + rank * n + offs, x, mask=mask)
        for i in range(1, world_size):       # my block into my slot on every peer
            peer = (rank + world_size - i) % world_size
            tdl.store(slots + rank * stride + offs, x, rank, peer, heap_bases, mask=mask)
    ok, t0 = push_exchange(flags, epoch, ctrl, rank, world_size, heap_bases, OP_ALL_GATHER,
                           fp, trace_buf, t0, TRACE)
    gather_slots(out, slots, stride, n, ok, rank, world_size, BLOCK)


def throwaway(ctx, plan, out, inp, block=None, programs=None):
    """out, inp: flat word views (checked by the caller); out has world * inp.numel()."""
    n = inp.numel()
    common.launch_push(ctx, plan, _throwaway_kernel, (out, inp), (), n, inp.dtype,
                       (n, inp.element_size()), block, programs)
'''


def write_kernel_file(folder) -> str:
    path = folder / f"{NAME}.py"
    path.write_text(KERNEL_FILE)
    return str(path)


@contextlib.contextmanager
def throwaway(path: str):
    """The kernel file at `path` imported as MODULE, and LINE in the registry, in this
    process for the duration; both gone after."""
    spec = importlib.util.spec_from_file_location(MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    try:
        spec.loader.exec_module(module)
        with algorithms.declared(LINE):
            yield module
    finally:
        del sys.modules[MODULE]


def test_the_registry_derived_lists_take_a_new_algorithm(tmp_path):
    """With the throwaway declared: every list the tests take from the registry has it --
    the all_gather values check's cases, each family's algorithms, the graph replay's
    rounds -- its declaration passes test_registry's check, and the sm_90 list's check
    names its kernel as the one without an entry. After: none of it is left."""
    path = write_kernel_file(tmp_path)
    listed = test_sm90.registry_kernels(("all_gather",))        # the list, as it covers them
    before = algorithms.kernels("all_gather")
    with throwaway(path):
        assert algorithms.kernels("all_gather") == before + [NAME]
        assert registry.names("all_gather")[-1] == "nccl"
        assert [c for c in test_all_gather.cases() if c[0] == NAME] == \
            [(NAME, *case) for case in test_all_gather.EVERY]
        for family in ("mismatched_grids", "sanitize"):
            assert ("all_gather", NAME) in algorithms.pairs(("all_gather",), family)
        assert NAME in [r["all_gather"] for r in test_graph_replay.rounds()]
        check_declaration(registry.get("all_gather", NAME))
        assert test_sm90.unlisted(listed, ("all_gather",)) == {
            f"{MODULE}._throwaway_kernel": f"all_gather {NAME}"}
    assert algorithms.kernels("all_gather") == before and MODULE not in sys.modules
    assert registry.get("all_gather", NAME) is None


def _throwaway_values(ctx, path):
    """In this rank's process: the all_gather values check (test_all_gather's own
    function) on the throwaway's cases, through plans of its own; a knob it does not take
    rejected by the options check; its plans dropped at the end; after, the name is
    unknown again."""
    import torch
    with throwaway(path):
        cases = [c for c in test_all_gather.cases() if c[0] == NAME]
        ctx.plans.clear()
        test_all_gather._all_gather_cases(ctx, cases)
        built = ctx.plans.order()             # the plans of its calls, and only those
        assert built and all(NAME in key for key in built), built
        inp = torch.ones(8, device=ctx.device)
        out = torch.empty(8 * ctx.world_size, device=ctx.device)
        with pytest.raises(ValueError, match=rf"all_gather {NAME}: unknown option\(s\) \['warps'\]"):
            ctx.all_gather(out, inp, algorithm=NAME, warps=4)
        ctx.sync()
        ctx.plans.clear()             # they hold its kernel
    with pytest.raises(ValueError, match=f"unknown algorithm '{NAME}'"):
        ctx.all_gather(out, inp, algorithm=NAME)
    return len(cases)


def test_a_new_all_gather_passes_the_values_check(pool, tmp_path):
    if pool.world_size == 1:
        pytest.skip("one rank launches no kernel")
    assert pool.run(_throwaway_values, write_kernel_file(tmp_path)) == \
        [len(test_all_gather.EVERY)] * pool.world_size
