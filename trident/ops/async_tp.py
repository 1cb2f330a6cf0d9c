"""The "async_tp" schedule: PyTorch's async-TP, torch.ops.symm_mem.fused_all_gather_matmul
(all_gather_matmul) and fused_matmul_reduce_scatter (matmul_reduce_scatter), on the
context's torch.distributed group. Torch cuts the GEMM into world chunks and runs cuBLAS
on one chunk while the next one moves between the ranks' symmetric-memory workspace on a
second stream. There is no matmul_all_reduce: torch has no fused matmul + all-reduce.

The call is the one `trident bench ops` times as its torch async-TP baseline (the
`torch_symm_mem` row calls `torch_call` below): all_gather_matmul with return_A=True,
which keeps torch off its multimem (NVLink SHARP) path -- multicast stays off everywhere
(TORCH_SYMM_MEM_DISABLE_MULTICAST=1, trident/runtime/_env.py), and no multimem op is called.

What it needs: a GPU per rank (torch's symmetric memory and NCCL, `needs_nccl` like
"plain"), and a torch whose symm_mem library has the op. Where these are missing (the CPU
emulation, ranks sharing a GPU, an older torch), asking for it raises a ValueError saying
why and naming the schedules that can run (auto.resolve), and "auto" never picks it.

Bias and out, as the other schedules give them: torch's ops take neither, so the bias is
added to torch's result afterwards (one elementwise pass; once, to the reduced rows, for
matmul_reduce_scatter), and a given `out` is filled from it (the addition writes into
it, or a copy). A call without `out` returns torch's own output tensor (no copy): the
plan's new_out gives None and its one step returns the output (_common.run).

CUDA graphs: torch's ops can be captured (`trident bench ops` replays them from graphs),
as long as the group's symmetric-memory workspace is large enough before the capture
(torch cannot grow it while capturing). Each build reserves what the call needs, so an
eager call of the same size (the warm-up every schedule asks for) makes the capture safe;
a first call captured without one raises a RuntimeError saying so.

Errors: torch's ops have no bounded waits or call fingerprints (trident/runtime/errors.py's
contract covers trident's own kernels): like "plain" (NCCL), a rank that never makes the
call leaves its peers waiting in torch.
"""
from __future__ import annotations

import warnings

import torch

from . import _common
from .schedules import register

TORCH_OPS = {"all_gather_matmul": "fused_all_gather_matmul",
             "matmul_reduce_scatter": "fused_matmul_reduce_scatter"}
OPS = tuple(TORCH_OPS)
NO_ALL_REDUCE = ("torch has no fused matmul + all-reduce (its async-TP ops are "
                 "all_gather_matmul and matmul_reduce_scatter only)")


def _symm_mem():
    """torch.distributed._symmetric_memory (importing it registers torch.ops.symm_mem's
    Python-side ops), or None where this torch has none."""
    try:
        from torch.distributed import _symmetric_memory
    except Exception:                               # noqa: BLE001 -- any import failure
        return None
    return _symmetric_memory


def why_not(ctx, op: str) -> str | None:
    """Why "async_tp" cannot run `op` on ctx (None where it can): an op torch has no
    async-TP for, the CPU emulation, a torch without the op. (Ranks sharing a GPU: the
    registry's needs_nccl, schedules.unavailable.)"""
    if op not in TORCH_OPS:
        return NO_ALL_REDUCE
    if ctx is None or ctx.backend != "cuda":
        return "torch async-TP needs GPUs (not on the CPU emulation)"
    if _symm_mem() is None or not hasattr(torch.ops.symm_mem, TORCH_OPS[op]):
        return f"torch {torch.__version__} has no torch.ops.symm_mem.{TORCH_OPS[op]}"
    return None


def _workspace_bytes(op: str, a, w, world: int) -> int:
    """The symmetric-memory workspace torch's op needs: a's bytes (all_gather_matmul),
    two chunks of the product (matmul_reduce_scatter)."""
    if op == "all_gather_matmul":
        return a.shape[0] * a.shape[1] * a.element_size()
    return 2 * (a.shape[0] // world) * w.shape[0] * a.element_size()


def prepare(ctx, op: str, a, w) -> str:
    """The group name torch's op takes, for a call of `op` on tensors shaped like a, w:
    symmetric memory enabled for the context's group (torch before 2.13 needs it; later
    ones say it is not needed), its workspace reserved for the call (a collective of the
    group, before any capture: the capture of a call whose workspace is too small raises
    a RuntimeError)."""
    symm_mem = _symm_mem()
    group = ctx.group.group_name
    if hasattr(symm_mem, "enable_symm_mem_for_group"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(group)
    try:
        symm_mem.get_symm_mem_workspace(group, min_size=_workspace_bytes(
            op, a, w, ctx.world_size))
    except RuntimeError as exc:
        if not torch.cuda.is_current_stream_capturing():
            raise
        raise RuntimeError(
            f"{op}: schedule 'async_tp': the first call of this size is being captured into "
            f"a CUDA graph, but torch's symmetric-memory workspace must grow first, which a "
            f"capture cannot contain. Call the op once eagerly before capturing (a warm-up; "
            f"torch.compile's mode='reduce-overhead' does one itself). torch: {exc}") from exc
    return group


def torch_call(op: str, group: str, a, w) -> torch.Tensor:
    """torch's async-TP op for `op` on this rank's a and w (nn.Linear layout [N, K]):
    all_gather(a) @ w.T, or this rank's rows of reduce_scatter(a @ w.T); no bias. What the
    bench's torch_symm_mem row times."""
    if op == "all_gather_matmul":        # return_A: never the multimem path
        return torch.ops.symm_mem.fused_all_gather_matmul(a, [w.t()], 0, group,
                                                          return_A=True)[1][0]
    return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, w.t(), "sum", 0, group)


def _none():
    return None


def build(ctx, plan, op: str, a, w, bias, out) -> None:
    """Add the async_tp schedule's one step for `op` to `plan` (module docstring)."""
    why = why_not(ctx, op)
    if why is not None:                 # auto.resolve refuses first; a direct build too
        raise ValueError(f"{op}: schedule 'async_tp': {why}")
    group = prepare(ctx, op, a, w)
    fresh = _common.is_stand_in(out)

    def step(ts):
        y = torch_call(op, group, ts[0], ts[1])
        if fresh:
            return y if ts[2] is None else y.add_(ts[2])
        if ts[2] is None:
            return ts[3].copy_(y)
        return torch.add(y, ts[2], out=ts[3])
    if fresh:
        plan.new_out = _none            # the step returns torch's output (_common.run)
    # torch's op runs into the caller's capture, like NCCL's: never a graph of the plan
    plan.add(step, graphable=False)


register("async_tp", build, ops=OPS, needs_nccl=True, why_not=why_not, cost=None,
         about="torch async-TP: torch.ops.symm_mem fused ops, cuBLAS + symmetric memory")
