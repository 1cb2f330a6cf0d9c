"""What a fused-op call may leave behind: nothing it allocated on the calling thread but its
output, and plans that keep no tensor but the heap's, the context's and the workspace's
split-K buffers -- for every config family of the GEMM core, "auto" and "plain", on the
CPU emulation and on GPUs alike.

Why: torch.compile(mode="reduce-overhead") warms a graph up and records it with every
allocation of the calling thread routed into the CUDA graphs' private pool (torch >= 2.8:
any stream). A buffer a call keeps from there -- a plan's split-K workspace, a launch's
global scratch -- is a live block of the pool that no graph output accounts for, and
Inductor raises "Detected N tensor(s) in the cudagraph pool not tracked as outputs"
(examples/tp_decode.py --sum matmul_all_reduce on one H100, once the fused ops took the
GEMM table's swap-AB / split-K configs at decode sizes: the per-stream split-K workspace
and the kept TMA-descriptor scratch, both made in the warm-up). Here a dispatch mode, which
like that routing sees the calling thread only, records every tensor storage an aten op
creates during the call; after it, only the output's may be alive. Each family runs on a
fresh context, so that its first call makes the workspaces, plans and buffers.

The row-parallel ops' TMA launches take host-made descriptors (no global scratch; their
sm_90 compilation is checked below). all_gather_matmul's still make theirs in the kernel:
on GPUs its Launch keeps a scratch buffer per stream, made at its first run outside the
graph pools (trident/runtime/triton_launch.py kept_buffer, on trident's allocation thread), so it
is not one of the calling thread's storages that the first check looks for.

The GPU check of the same thing, through Inductor itself: tests/torch_ops/
test_capture_all.py::test_compiled_reduce_overhead."""
import time

import pytest
import torch
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

import trident as td
from trident.runtime.context import _not_capturing
from trident.ops import _common
from trident.runtime.triton_launch import Launch

from ..compile import run_check
from ..conftest import BACKEND
from ..torch_ops import capture_cases as C

FUSED = ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce")


class _Allocations(TorchDispatchMode):
    """Storages made on this thread while active: outputs of aten ops that share no
    input's storage (factories, out-of-place ops; not views), each as [weak reference,
    address, the op's name, whether it was then handed to a torch.distributed collective
    (an argument of a c10d op)]."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        if func.namespace == "c10d":
            for made in self.made:
                made[3] = made[3] or (made[1] in inputs and not made[0].expired())
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                if s.nbytes() and s.data_ptr() not in inputs:
                    self.made.append([StorageWeakRef(s), s.data_ptr(), str(func), False])
        return out

    def alive(self, keep=()) -> list[str]:
        """The ops whose storages are still alive, except those of `keep` (tensors): at
        once, without gc.collect (a call's storages go by reference counting: none of this
        file's calls left one to the collector), except a storage handed to a
        torch.distributed collective, which may take up to 2 s to go.

        Why that one: torch's gloo backend keeps a collective's tensors in its work
        object, and the worker thread that ran the collective drops the work only after it
        has woken the waiting caller (ProcessGroupGloo::runLoop, before it takes its next
        work). So the plain path's gather buffer (all_gather_matmul's aten.empty, handed to
        gloo's all_gather) was alive right after a call now and then: once in a clean-clone
        CI run at world 3; here 26 of 600 plain calls at world 2, no Python object left
        referring to it, gone within a millisecond. torch alone shows it (2 ranks, 2000
        calls each, `del` of the output right after the call): alive in 7-9% of
        dist.all_gather_into_tensor calls, for up to 24 ms on the loaded 2-core machine; on
        a ProcessGroupGloo of one worker thread, alive in 30% but in none once a later
        collective on that group had completed; with torch's default of two threads, still
        in 11% after one (the other thread served it). Nothing of trident holds it, and
        the caller has no way to wait for that thread on a group of two. (NCCL's process
        group keeps a collective's tensors with its work too; not measured here.) A storage
        kept for good is still reported, after 2 s."""
        allowed = {t.untyped_storage().data_ptr() for t in keep}
        left = [m for m in self.made if not m[0].expired() and m[1] not in allowed]
        deadline = time.monotonic() + 2.0
        while any(handed for *_, handed in left) and time.monotonic() < deadline:
            time.sleep(0.001)
            left = [m for m in left if not (m[3] and m[0].expired())]
        return [f"{op} ({ptr:#x}{', handed to a collective' if handed else ''})"
                for _, ptr, op, handed in left]


def _storage(t) -> int:
    return t.untyped_storage().data_ptr()


def _kept_by(step, own: set) -> list:
    """Tensors a plan's step keeps past the call, other than the call's own (`own`:
    storages). GPUs: a Launch's `keep`, its descriptors' bases and its global scratch; the
    CPU emulation's Launch keeps its arguments (by design: the call's own among them), a
    host step (the plain path) its closure."""
    if isinstance(step, Launch):
        if getattr(step, "fast", None) is not None:
            values = list(step.keep) + list(step.packed)
        else:
            values = list(step.args) + list(step.kwargs.values())
        for v in list(values):
            if hasattr(v, "block_shape"):              # a host TMA descriptor
                values.append(v.base)
        # a Launch's global scratch (kept_buffer) is made off the calling thread, outside
        # the graph pools: the first check of _check_family would see it otherwise
    else:
        values = [c.cell_contents for c in getattr(step, "__closure__", None) or ()]
    return [v for v in values if isinstance(v, torch.Tensor) and _storage(v) not in own]


def _check_family(ctx, op, variant, problems):
    case = C.make_case(ctx, op, variant)
    for call in range(2):               # the first builds plans and workspaces; the second not
        inputs = case.inputs(call)
        own = {_storage(t) for t in inputs if isinstance(t, torch.Tensor)}
        before = set(ctx.plans._plans)
        with _Allocations() as rec:
            got = case.fn(*inputs)
        ctx.sync()
        C.check(got, case.expected(call), f"{op} {variant} rank {ctx.rank} call {call}")
        what = f"{op} {variant} call {call}"
        left = rec.alive(keep=got)
        if left:
            problems.append(f"{what}: storages allocated on the calling thread still alive "
                            f"after the call: {left}")
        allowed = {_storage(ctx.heap_bases)} | {
            _storage(t) for ws in ctx._workspaces.values()
            if isinstance(ws, _common.Workspace) for pair in getattr(ws, "split", {}).values()
            for t in pair}
        for key in set(ctx.plans._plans) - before:
            for step in ctx.plans._plans[key].steps:
                kept = [t for t in _kept_by(step, own)
                        if not ctx.is_symmetric(t) and _storage(t) not in allowed]
                if kept:
                    problems.append(f"{what}: plan {key[5]!r} keeps tensors that are neither "
                                    f"the heap's nor the workspace's: "
                                    f"{[(tuple(t.shape), t.dtype) for t in kept]}")
                if isinstance(step, Launch) and getattr(step, "fast", None) is not None:
                    bases = [v.base for v in step.packed if hasattr(v, "block_shape")]
                    if any(isinstance(b, torch.Tensor) for b in bases):
                        problems.append(f"{what}: a TMA descriptor of the plan keeps its "
                                        f"tensor (the call's input) alive")
        del got
        ctx.barrier()
    case.close()


def _tma_launch_args(ctx, op, problems):
    """The row-parallel ops' TMA launches take host-made descriptors for a and w: no
    descriptor made in the kernel, so no global scratch for a Launch to keep."""
    case = C.make_case(ctx, op, "fused/swab_split")
    case.fn(*case.inputs(0))
    ctx.sync()
    # every plan of the op on this fresh context (_check_family's calls built them: the
    # same sizes, so this call built none)
    launches = [s for k, plan in ctx.plans._plans.items() if k[0] == op
                for s in plan.steps if isinstance(s, Launch)]
    if not launches:
        problems.append(f"{op}: no launch in the plans of a fused call")
    for launch in launches:
        args = launch.packed if getattr(launch, "fast", None) is not None else launch.args
        if not all(hasattr(a, "block_shape") for a in args[:2]):
            problems.append(f"{op}: TMA launch whose a and w are not host descriptors: "
                            f"{[type(a).__name__ for a in args[:2]]}")
        if getattr(launch, "scratch", None):
            problems.append(f"{op}: the TMA launch keeps global scratch")
    ctx.barrier()


def _families(ctx, op, variants):
    problems = []
    for variant in variants:
        # a fresh context per family: its first call makes everything anew
        with td.init(heap_size=16 << 20, group=ctx.group) as fresh:
            _check_family(fresh, op, variant, problems)
            if op != "all_gather_matmul" and variant == "fused/swab_split":
                _tma_launch_args(fresh, op, problems)
    return problems


@pytest.mark.parametrize("op", FUSED)
def test_calls_leave_nothing_allocated(pool, op):
    gpu_per_rank = BACKEND == "cuda" and pool.world_size <= torch.cuda.device_count()
    variants = [v for v in C.fused_variants(op)
                if (v not in C.NCCL_VARIANTS or BACKEND != "cuda" or gpu_per_rank)
                and (v not in C.GPU_VARIANTS or gpu_per_rank)]
    for rank, problems in enumerate(pool.run(_families, op, variants)):
        assert not problems, f"rank {rank}:\n" + "\n".join(problems)


def _moe(ctx, path):
    """MoE dispatch and combine through the torch ops: nothing made on the calling thread
    outlives a call but its outputs (the ExpertParallel's buffers are made with it, before
    any call; tests/plans/test_plan_refs.py checks on GPUs that its plans keep no caller
    tensor -- the CPU emulation's launches keep theirs by design, so expert_y is made
    outside the recorded calls here)."""
    problems, world, topk, tokens, hidden = [], ctx.world_size, 2, 8, 128
    ops = torch.ops.trident
    with td.init(heap_size=16 << 20, group=ctx.group) as fresh:
        ep = td.ExpertParallel(fresh, 2 * world, topk, hidden, 16, dtype=torch.bfloat16,
                               high_throughput=path == "high_throughput")
        for call in range(2):
            g = torch.Generator().manual_seed(100 * call + fresh.rank)
            x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).to(fresh.device)
            idx = torch.stack([torch.randperm(2 * world, generator=g)[:topk]
                               for _ in range(tokens)]).to(fresh.device)
            wts = torch.rand(tokens, topk, generator=g).to(fresh.device)
            with _Allocations() as rec:
                expert_x, counts = ops.moe_dispatch(x, idx, None, ep.name)
            left = rec.alive(keep=(expert_x, counts))
            expert_y = expert_x * 2
            with _Allocations() as rec2:
                y = ops.moe_combine(expert_y, wts, ep.name, tokens)
            fresh.sync()
            left += rec2.alive(keep=(y,))
            want = 2 * x.float() * wts.sum(1, keepdim=True)
            C.check((y,), (want,), f"moe {path} rank {fresh.rank} call {call}")
            if left:
                problems.append(f"moe {path} call {call}: storages allocated on the calling "
                                f"thread still alive after the calls: {left}")
            del expert_x, counts, expert_y, y
            fresh.barrier()
        ep.close()
    return problems


@pytest.mark.parametrize("path", ["low_latency", "high_throughput"])
def test_moe_calls_leave_nothing_allocated(pool, path):
    for rank, problems in enumerate(pool.run(_moe, path)):
        assert not problems, f"rank {rank}:\n" + "\n".join(problems)


def test_tma_launches_need_no_scratch_sm90(tmp_path):
    """The row-parallel kernel with host descriptors compiles for sm_90 with TMA copies
    and wgmma and needs no global scratch (tests/ops/fused_sm90.py; no GPU needed)."""
    run_check("tests.ops.fused_sm90", tmp_path / "cache", "fused_sm90: ok", timeout=600)


# what Inductor records under mode="reduce-overhead" after one eager warm-up, with
# ctx.capturing() true (the key and the selection differ there: trident/ops/sequential.py
# builds a new plan with ccl sub-plans for graphs; "auto" may pick other algorithms)
CAPTURED = [(op, v) for op in FUSED for v in ("sequential", "auto")] + \
    [("all_reduce_add_rmsnorm", "auto")]


def _closure_tensors(step) -> list:
    """Tensors a host step's closure holds, directly or in tuples and lists."""
    found = []
    todo = [c.cell_contents for c in getattr(step, "__closure__", None) or ()]
    while todo:
        v = todo.pop()
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (tuple, list)):
            todo.extend(v)
    return found


def _capturing(ctx, cases):
    """Each case's first call eager (the warm-up: workspaces and plans made there), the
    second with ctx.capturing() forced true, as in a recording: nothing allocated on the
    calling thread during that call may outlive it but the output (tensors kept from a
    recording are blocks of the graphs' pool no output accounts for: Inductor's "Detected
    N tensor(s) in the cudagraph pool not tracked as outputs", test_capture_all.py's
    fused and fused_matmul-sequential families on an H100); and no host step of a plan
    made then holds the call's inputs (Inductor records with copies of them made in the
    pool, then drops them: the sequential all_gather_matmul's kept its a)."""
    problems = []
    for op, variant in cases:
        with td.init(heap_size=16 << 20, group=ctx.group) as fresh:
            case = C.make_case(fresh, op, variant)
            for call in range(2):
                inputs = case.inputs(call)
                before = set(fresh.plans._plans)
                forced = call == 1
                if forced:
                    fresh.capturing = fresh.plans.capturing = lambda: True
                try:
                    with _Allocations() as rec:
                        got = case.fn(*inputs)
                finally:
                    fresh.capturing = fresh.plans.capturing = _not_capturing
                fresh.sync()
                C.check(got, case.expected(call), f"{op} {variant} rank {fresh.rank} {call}")
                left = rec.alive(keep=got)
                if left:
                    problems.append(f"{op} {variant} call {call} (capturing: {forced}): "
                                    f"storages allocated on the calling thread still "
                                    f"alive after the call: {left}")
                # Inductor hands a recorded call copies of its inputs made in the pool and
                # drops them after: a plan's host step that keeps one keeps a block no
                # output tracks (the CPU emulation's launches keep their arguments by
                # design, so the host steps' closures are what is checked)
                own = {_storage(t) for t in inputs if isinstance(t, torch.Tensor)}
                for key in set(fresh.plans._plans) - before:
                    held = [t for step in fresh.plans._plans[key].steps
                            if not isinstance(step, Launch) for t in _closure_tensors(step)
                            if _storage(t) in own]
                    if held:
                        problems.append(f"{op} {variant} call {call} (capturing: {forced}): "
                                        f"plan {key[0]!r} keeps the call's input tensors "
                                        f"{[tuple(t.shape) for t in held]} in a host step")
                del got, inputs
                fresh.barrier()
            case.close()
    return problems


@pytest.mark.skipif(BACKEND == "cuda", reason="forces ctx.capturing() on the CPU emulation; "
                    "GPUs record for real (test_capture_all.py)")
def test_a_recorded_call_leaves_nothing_allocated(pool):
    for rank, problems in enumerate(pool.run(_capturing, CAPTURED)):
        assert not problems, f"rank {rank}:\n" + "\n".join(problems)
