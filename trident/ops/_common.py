"""What the three fused ops share: input checks, tile sizes per backend, the workspace
(heap buffers + epoch/ack words that make reuse safe without memsets), the GEMM tile, and
the switch between the GEMM cores.

The GEMM core (ctx.options.gemm: TRIDENT_GEMM as the context read it; a call's `gemm=`
option overrides it and is part of the plan key like every option):
- "auto" (the default): "tma" for GEMMs of M >= TMA_MIN_M rows, and below that where the
  GEMM table's entry is a small-M one (swap-AB or split-K: the core's decode choice,
  fused_tile.fused_gemm_config), else "classic". On 2x H200 at M = 8192 "tma" made every
  fused op faster than "classic" and than NCCL + cuBLAS eagerly (docs/history.md, "Notes
  moved out of the source"); at M = 1024 and 2048 it made all three fused ops about 1.1x
  faster than "classic" from a graph where 2 ranks share one H200 (the GEMM side, not
  NVLink: docs/history.md, "auto's GEMM core from 1024 rows"), so TMA_MIN_M is 1024.
  Below it the table's small-M entries are what the core alone measured (or starting
  points), not the fused ops.
- "classic": one output tile (or split-K slice) per GEMM program,
  pointer loads (gemm_tile), tile sizes from gemm_config.
- "tma": trident/ops/gemm.py's core inside the fused kernels -- persistent GEMM programs,
  one per SM at most, that take output tiles from a queue word of the workspace (an
  atomic counter, in the op's tile order, rearmed by the last program), TMA loads of A
  and W where gemm.tma_compatible allows (the pointer path otherwise, same kernel), tile
  configs from gemm_table.json by shape class (gemm.config_for; warp specialisation is
  not used: the tile loop waits on flags), swap-AB and split-K included (fused_tile.py).
- "gluon": persistent GEMM programs that are warp specialised in Gluon (gemm_ws.py's
  producer warp and consumer warp groups): all_gather_matmul's (trident/ops/fused_gluon.py,
  the producer waiting for each tile's rows before its TMA loads) and the row-parallel
  ops' (trident/ops/matmul_reduce_gluon.py, the consumers pushing each finished tile to
  its owner). sm_90 GPUs (all_gather_matmul: K % 8 == 0); elsewhere (the CPU emulation
  too) it runs "tma". Never "auto"'s choice: not yet measured with a GPU per rank.

Epochs (trident/language/epoch.py). Every fused kernel reads its workspace's epoch word
at the start (this call is epoch e = stored + 1) and waits for flags to reach e, so flags
never need resetting. The last program of the grid to finish (a done-counter) stores e
and tells every peer "rank r is done with epoch e" through the ack words; a rank writes
into a peer's buffers in epoch e only once that peer acked e - 1. All of it lives on the
device, so a call is one launch, needs no host synchronisation and can be captured in a
CUDA graph.
"""
from __future__ import annotations

import weakref

import torch
import triton
import triton.language as tl

from .. import language as tdl
from ..runtime._env import INTERPRET
from ..runtime.graph_pools import outside_graph_pools  # noqa: F401  (ops' kept buffers)
from ..runtime import plans
from ..runtime.plans import Plan, tensor_key

DTYPES = (torch.bfloat16, torch.float16)

# Sync words of a workspace (int32): [EPOCH, DONE, pad..., ACK(world) ..., FLAGS ...]
SYNC_EPOCH = tl.constexpr(0)
SYNC_DONE = tl.constexpr(1)
SYNC_QUEUE = tl.constexpr(2)     # next output tile of the persistent GEMM programs ("tma")
SYNC_ACK = tl.constexpr(8)
SYNC_FLAGS = tl.constexpr(8 + 64)

# The interpreter's tl.dot gives garbage for bfloat16 operands (NumPy has no bfloat16):
# there, operands are widened to fp32 first. Compiled kernels keep bf16/fp16 tensor cores.
DOT_UPCAST = tl.constexpr(INTERPRET)


# ---------------------------------------------------------------------------- input checks
def check_matrix(ctx, t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be a 2-D matrix, got shape {list(t.shape)}")
    if t.dtype not in DTYPES:
        raise TypeError(f"{name} must be bfloat16 or float16, got {t.dtype}")
    if t.device != ctx.device:
        raise ValueError(f"{name} is on {t.device}, expected this rank's device {ctx.device}")
    ctx.check_not_freed(t, name)


def check_matrices(ctx, op: str, a, w, bias, out) -> None:
    """Before a build reads the output's shape off a and w: where either is not a 2-D
    tensor, the error check_inputs raises for it (never an AttributeError of a list)."""
    for t in (a, w):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            check_inputs(ctx, op, a, w, bias, out, ())


def check_inputs(ctx, op: str, a, w, bias, out, out_shape,
                 empty_k: bool = False) -> torch.Tensor | None:
    """Validate a, w (nn.Linear layout [N, K]), bias [N] and out; returns out or None.
    empty_k: K = 0 is valid (a row-parallel rank whose shard of K is empty contributes
    zeros; rejecting it on that rank alone would leave its peers waiting)."""
    check_matrix(ctx, a, f"{op}: a")
    check_matrix(ctx, w, f"{op}: w")
    if w.dtype != a.dtype:
        raise TypeError(f"{op}: w has dtype {w.dtype} but a has {a.dtype}; they must match")
    if a.shape[1] != w.shape[1]:
        raise ValueError(f"{op}: a is [M, K] = {list(a.shape)} and w is [N, K] = "
                         f"{list(w.shape)} (nn.Linear layout): their K differ")
    if a.shape[0] == 0 or (a.shape[1] == 0 and not empty_k) or w.shape[0] == 0:
        raise ValueError(f"{op}: empty matrix (a {list(a.shape)}, w {list(w.shape)})")
    if a.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"{op}: a and w need a contiguous last dimension (stride 1); got "
                         f"strides {a.stride()} and {w.stride()}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"{op}: bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if bias.dim() != 1 or bias.shape[0] != w.shape[0]:
            raise ValueError(f"{op}: bias must have shape [{w.shape[0]}] (w's rows), got "
                             f"{list(bias.shape)}")
        if bias.dtype not in (*DTYPES, torch.float32):
            raise TypeError(f"{op}: bias must be bfloat16, float16 or float32, got {bias.dtype}")
        if bias.device != ctx.device:
            raise ValueError(f"{op}: bias is on {bias.device}, expected {ctx.device}")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{op}: out must be a torch.Tensor or None, got {type(out).__name__}")
        if tuple(out.shape) != tuple(out_shape) or out.dtype != a.dtype or out.device != ctx.device:
            raise ValueError(f"{op}: out must be a {list(out_shape)} {a.dtype} tensor on "
                             f"{ctx.device}, got {list(out.shape)} {out.dtype} on {out.device}")
        if out.stride(1) != 1:
            raise ValueError(f"{op}: out needs a contiguous last dimension, got strides {out.stride()}")
    return out


def run(ctx, op: str, build, a, w, bias, out, algorithm: str, options: dict) -> torch.Tensor:
    """Run the launch plan of this call's signature (trident/runtime/plans.py), building it first
    if the signature is new (plans.call); allocate `out` (shape from the plan) when not
    given. `algorithm`: the schedule the call asked for (schedules.normalize)."""
    capturing = ctx.capturing()
    key = plan_key(op, a, w, bias, out, algorithm, options, capturing)
    plan = ctx.plans.get(key)
    if plan is None or ctx.debug:
        return _call(ctx, key, plan, build, a, w, bias, out, algorithm, options)
    if out is None:
        # a fresh tensor per call: the caller keeps it. None: the plan makes it, and its
        # one step returns it (a schedule that calls an op which allocates, async_tp.py)
        out = plan.new_out()
        if out is None:
            out = plan.run((a, w, bias, None))
        else:
            plan.run((a, w, bias, out))
    else:
        plan.run((a, w, bias, out))
    return out


def plan_key(op: str, a, w, bias, out, algorithm: str, options: dict, capturing: bool) -> tuple:
    """The plan cache's key of a call (run): its tensors, the schedule it asked for, its
    options, and whether it is being captured."""
    return (op, tensor_key(a), tensor_key(w), None if bias is None else tensor_key(bias),
            None if out is None else tensor_key(out), algorithm,
            _options_key(options) if options else None, capturing)


def ran(ctx, op: str, a, w, algorithm: str = "auto", capturing: bool = False) -> str | None:
    """The schedule of the plan that a call of `op` on (a, w) -- no bias, out or options --
    asking for `algorithm` runs (eagerly, or under a capture), if it was built; else None."""
    plan = ctx.plans.get(plan_key(op, a, w, None, None, algorithm, {}, capturing))
    return None if plan is None else plan.name


def _call(ctx, key, found, build, a, w, bias, out, algorithm, options) -> torch.Tensor:
    """`run` through the plan driver: a new signature, or debug mode. Debug mode's checks
    are a host collective and a synchronisation, which a CUDA-graph capture cannot
    contain: skipped while capturing (a replay's errors still surface at the next
    ctx.sync() / ctx.barrier()). The capture twin's build sees a context that says it is
    capturing (_AsCaptured). (Apart from `run`: its closures would make run's variables
    cells, slower to read on the warm path.)"""
    capturing, op = key[-1], key[0]
    return plans.call(
        ctx, key,
        lambda capture: build(_AsCaptured(ctx) if capture and not capturing else ctx,
                              a, w, bias, out, algorithm, options),
        (a, w, bias, out), found=found,
        signature=None if capturing else lambda: debug_signature(op, a, w, bias, algorithm))[3]


def schedule_plan(ctx, op: str, a, w, bias, out, out_shape, name: str, options: dict,
                  M: int, N: int, K: int) -> Plan:
    """The plan of a checked call of `op` that asked for schedule `name` ("auto" resolved
    here from M, N, K: auto.resolve): its steps from the schedule's build (schedules.py);
    under "auto" the options the chosen schedule does not take are left out."""
    from . import auto, schedules
    chosen = auto.resolve(ctx, op, name, M, N, K)
    if name == "auto":
        options = schedules.options_for(chosen, options, op)
    plan = new_plan(ctx, a, w, bias, out, out_shape, chosen)
    schedules.build(ctx, plan, op, chosen, a, w, bias, plan.tensors[3], options)
    return plan


class _AsCaptured:
    """The context as a capture twin's build sees it (plans.plan_for): capturing() is
    True, everything else is the context's own (its workspaces, heap, rank, ...)."""
    __slots__ = ("_ctx",)

    def __init__(self, ctx):
        self._ctx = ctx

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    @staticmethod
    def capturing() -> bool:
        return True


def _options_key(options: dict) -> tuple:
    """The options' part of a plan key: (name, repr(value)) pairs in name order (values
    such as a config dict are not hashable; repr also keeps 1 and True apart)."""
    if len(options) == 1:
        for k, v in options.items():
            return ((k, repr(v)),)
    return tuple(sorted((k, repr(v)) for k, v in options.items()))


def debug_signature(op: str, a, w, bias, algorithm: str) -> tuple:
    """What must agree across ranks in a fused op's call: the dtype, the algorithm and the
    sizes where the ranks' data meet. all_gather_matmul gathers a's rows: M and K (each
    rank's w may have its own N). The row-parallel ops reduce [M, N] products: M and N
    (K is each rank's own shard and may differ). Not-yet-checked inputs compare by type."""
    if not all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in (a, w)):
        return tuple(type(t).__name__ for t in (a, w)) + (algorithm,)
    sizes = (("M", a.shape[0]), ("K", a.shape[1])) if op == "all_gather_matmul" \
        else (("M", a.shape[0]), ("N", w.shape[0]))
    return sizes + (("dtype", str(a.dtype)), ("schedule", algorithm))


_stand_ins: weakref.WeakValueDictionary = weakref.WeakValueDictionary()   # id -> tensor


def new_plan(ctx, a, w, bias, out, out_shape, path: str) -> Plan:
    """The plan of a checked call. The output is the call's tensor 3, passed to kernels as
    Live(3) (a fresh tensor per call when the caller gives none); the build uses a
    stand-in of the same shape (`is_stand_in`)."""
    plan = Plan((), path)
    plan.set_output(out_shape, a.dtype, ctx.device)
    if out is None:
        out = plan.new_out()
        _stand_ins[id(out)] = out
    plan.tensors = (a, w, bias, out)
    return plan


def is_stand_in(out) -> bool:
    """Whether `out` (a plan's tensors[3] during its build) stands in for a fresh output
    per call: a step that reads the call's out must then not be frozen into a CUDA graph
    of the plan (Plan.add(..., graphable=False)); a given out's address is in the key."""
    return _stand_ins.get(id(out)) is out


# ---------------------------------------------------------------------------- tile sizes
def gemm_config(ctx, m: int, n: int, k: int) -> dict:
    """Tile sizes of the GEMM programs. Small blocks under the interpreter keep the CPU
    emulation fast; on Hopper 128x256x64 (8 warps, 3 stages) when there are enough tiles
    to fill the GPU, 128x128 otherwise, 64-row tiles for decode-sized M."""
    if ctx.backend != "cuda":
        return dict(BM=16, BN=32, BK=32, num_warps=4, num_stages=1)
    bm = 64 if m <= 64 else 128
    sms = ctx.usable_sms
    if bm == 128 and triton.cdiv(m, 128) * triton.cdiv(n, 256) >= sms:
        return dict(BM=128, BN=256, BK=64, num_warps=8, num_stages=3)
    return dict(BM=bm, BN=128, BK=64, num_warps=4 if bm == 64 else 8, num_stages=4)


GEMM_MODES = ("auto", "classic", "tma", "gluon")   # the default: ctx.options.gemm (TRIDENT_GEMM)
TMA_MIN_M = 1024           # "auto": the tma core from this many GEMM rows (see above)


def num_sms(ctx) -> int:
    if ctx.backend != "cuda":
        return 4
    return ctx.usable_sms


# ---------------------------------------------------------------------------- workspace
def _bucket(n: int) -> int:
    """Round up to a power of two so that nearby shapes share one workspace."""
    return 1 << max(int(n) - 1, 1).bit_length()


class Workspace:
    """Heap buffers of one fused op: `data` (bytes, viewed per call), and int32 sync words
    (epoch, done-counter, one ack per peer, then the per-tile ready flags); and this rank's
    split-K buffers (`split_buffers`), which are not on the heap.

    Calls that share a workspace are ordered (its epochs say so), so they can share its
    split-K buffers too, whatever stream they run on."""

    def __init__(self, ctx, data_bytes: int, num_flags: int):
        self.data = ctx.zeros(data_bytes, dtype=torch.uint8)
        self.num_flags = num_flags
        self.sync = ctx.zeros(int(getattr(SYNC_FLAGS, "value", SYNC_FLAGS)) + num_flags, dtype=torch.int32)
        self.device = ctx.device
        self.split: dict = {}       # (partial elements, tiles), both buckets -> (fp32, int32)

    def view(self, dtype: torch.dtype, *shape) -> torch.Tensor:
        n = 1
        for s in shape:
            n *= s
        return self.data[:n * dtype.itemsize].view(dtype).view(*shape)

    def split_buffers(self, op: str, partial_elems: int, tiles: int):
        """(fp32 partials >= partial_elems, int32 counters >= tiles, zeroed) of split-K
        launches on this workspace. Each rank's own size (its split count follows its K),
        so not on the heap, whose allocations must agree across ranks: made once per size
        bucket, outside every CUDA-graph pool (`outside_graph_pools`), and kept as long as
        the workspace, since plans and captured graphs hold their addresses. The kernels
        leave the counters at 0 after every launch."""
        key = (_bucket(partial_elems), _bucket(tiles))
        bufs = self.split.get(key)
        if bufs is None:
            dev = self.device
            bufs = self.split[key] = outside_graph_pools(
                dev, f"{op}'s split-K buffers",
                lambda: (torch.empty(key[0], dtype=torch.float32, device=dev),
                         torch.zeros(key[1], dtype=torch.int32, device=dev)))
        return bufs

    def reset(self) -> None:
        self.sync.zero_()
        for _, counters in self.split.values():
            counters.zero_()


def split_counters(ctx) -> list:
    """The split-K arrival counters of ctx's fused-op workspaces (all 0 between launches)."""
    return [c for ws in ctx._workspaces.values() if isinstance(ws, Workspace)
            for _, c in ws.split.values()]


def workspace(ctx, op: str, data_bytes: int, num_flags: int) -> Workspace:
    """The op's workspace for this size class: allocated on first use (on every rank, at the
    same call, since every rank makes the same calls) and reused afterwards."""
    key = ("trident.ops", op, _bucket(max(data_bytes, 256)), _bucket(max(num_flags, 64)))

    def make(c):
        # creation ends with a host barrier (device sync + host collective), which would
        # invalidate a CUDA-graph capture with an obscure CUDA error: say what to do instead
        if c.capturing():
            raise RuntimeError(
                f"{op}: the first call of this size is being captured into a CUDA graph, "
                f"but it must create the op's workspace first (a host barrier, which a "
                f"capture cannot contain). Call the op once eagerly before capturing (a "
                f"warm-up; torch.compile's mode='reduce-overhead' does one itself).")
        return Workspace(c, key[2], key[3])
    return ctx.workspace(key, make)


# ---------------------------------------------------------------------------- device side
@triton.jit
def tile_position(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Tile index -> (row block, column block), GROUP_M row blocks at a time so that the
    tiles running together share their w columns (and a's rows) in L2."""
    in_group = GROUP_M * num_pid_n
    first_m = (tile // in_group) * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % in_group) % size_m
    pid_n = (tile % in_group) // size_m
    return pid_m, pid_n


@triton.jit
def gemm_tile(a_ptr, stride_am, w_ptr, stride_wn, m0, n0, M, N, K,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr):
    """fp32 [BM, BN] tile of a[m0:m0+BM, :] @ w[n0:n0+BN, :].T. Out-of-range rows/columns
    are clamped to valid ones (their results are never stored), so only K needs a mask."""
    rows = (m0 + tl.arange(0, BM)) % M
    cols = (n0 + tl.arange(0, BN)) % N
    offs_k = tl.arange(0, BK)
    a_ptrs = a_ptr + rows[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + cols[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    return dot_ptrs(a_ptrs, w_ptrs, K, 0, tl.cdiv(K, BK), BM, BN, BK, EVEN_K)


@triton.jit
def dot_ptrs(a_ptrs, w_ptrs, K, k_lo, k_hi, BM: tl.constexpr, BN: tl.constexpr,
             BK: tl.constexpr, EVEN_K: tl.constexpr):
    """The pointer k-loop: fp32 [BM, BN] sum over the BK-steps k_lo <= ki < k_hi of
    a[:, ki*BK:] @ w[ki*BK:, :], from a_ptrs [BM, BK] and w_ptrs [BK, BN] that point at
    column (row) 0 of K of each row (column) -- any rows: e.g. rows of A on several ranks'
    heaps (the epilogue schedule's all_gather_matmul). K is masked unless EVEN_K."""
    offs_k = tl.arange(0, BK)
    a_ptrs += k_lo * BK
    w_ptrs += k_lo * BK
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(k_lo, k_hi):
        if EVEN_K:
            a = tl.load(a_ptrs)
            w = tl.load(w_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BK, other=0.0)
            w = tl.load(w_ptrs, mask=offs_k[:, None] < K - k * BK, other=0.0)
        if DOT_UPCAST:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, w, acc)
        a_ptrs += BK
        w_ptrs += BK
    return acc


@triton.jit
def add_bias(acc, bias_ptr, n0, N, BN: tl.constexpr, HAS_BIAS: tl.constexpr):
    return add_bias_at(acc, bias_ptr, n0 + tl.arange(0, BN), N, HAS_BIAS)


@triton.jit
def add_bias_at(acc, bias_ptr, cols, N, HAS_BIAS: tl.constexpr):
    """acc [rows, len(cols)] + bias[cols] (columns >= N add 0), if HAS_BIAS: add_bias with
    the columns given (a Gluon caller's, in its layout)."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def store_tile(out_ptr, stride_om, tile, m0, n0, m_end, N, BM: tl.constexpr, BN: tl.constexpr):
    """Store rows [m0, m_end) and columns [n0, N) of a [BM, BN] tile."""
    store_at(out_ptr, stride_om, tile, m0 + tl.arange(0, BM), n0 + tl.arange(0, BN), m_end, N)


@triton.jit
def store_at(out_ptr, stride_om, tile, rows, cols, m_end, N):
    """store_tile with the tile's rows and columns given (a Gluon caller's, in its
    layout): out[rows, cols] = tile where rows < m_end and cols < N."""
    ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(ptrs, tile.to(out_ptr.dtype.element_ty),
             mask=(rows[:, None] < m_end) & (cols[None, :] < N))


@triton.jit
def arrive_partial(acc, slot, counters, index, count, BM: tl.constexpr, BN: tl.constexpr):
    """The arrival of split-K's fix-up (finish_slice; gemm.py's stream-K too): store this
    program's fp32 partial [BM, BN] at `slot` and count it in counters[index] (acq_rel);
    True for the last of `count` arrivals, which alone may read the others' partials, and
    must set the counter back to 0."""
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    tl.store(slot + offs, acc)
    # every thread's partial before the arrival (release), the others' partials after it
    # (acquire) -- as in trident/language/epoch.py's last_program_out
    tl.debug_barrier()
    arrived = tl.atomic_add(counters + index, 1, sem="acq_rel", scope="gpu")
    return arrived == count - 1


@triton.jit
def finish_slice(acc, partials, counters, tile, s, split_k, BM: tl.constexpr,
                 BN: tl.constexpr):
    """Split-K's deterministic fix-up, slice s of `tile`: store this slice's fp32 partial
    (partials: [tiles * split_k, BM * BN]) and count it in the tile's arrival counter
    (acq_rel). The slice that arrives last sums the tile's partials in slice order,
    rearms the counter to 0 (every counter is 0 again after a launch: no memset, a CUDA
    graph can replay it) and returns (True, the sum); the others (False, acc). Only the
    last may store or publish the tile: the others' sums are incomplete."""
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    first = partials + tile.to(tl.int64) * split_k * (BM * BN)
    last = arrive_partial(acc, first + s * (BM * BN), counters, tile, split_k, BM, BN)
    if last:
        tl.store(counters + tile, 0)                     # rearmed for the next launch
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for i in range(split_k):                         # slice order: deterministic
            acc += tl.load(first + i * (BM * BN) + offs, cache_modifier=".cg")
    return last, acc


@triton.jit
def take_tile(sync, otherwise, PERSISTENT: tl.constexpr):
    """A GEMM program's next output tile: the queue's next (persistent), else `otherwise`
    (classic: the program's own tile first, then num_tiles, i.e. none)."""
    if PERSISTENT:
        t = tl.atomic_add(sync + SYNC_QUEUE, 1, sem="relaxed", scope="gpu")
    else:
        t = otherwise
    return t


@triton.jit
def wait_peers_done(sync, epoch, ctrl, rank, world_size, OP: tl.constexpr,
                    THREADS: tl.constexpr = 0):
    """Wait until every rank finished the previous call on this workspace (their ack);
    True if every wait succeeded. THREADS: who votes in each wait (tdl.wait)."""
    ok = tl.cast(1, tl.int1)
    for peer in range(world_size):
        ok = ok & tdl.wait(sync + SYNC_ACK + peer, epoch - 1, ctrl, rank, peer, OP, THREADS)
    return ok


# Call fingerprints of the fused kernels (the issue-29 contract, as trident/ccl/device.py
# does for the collectives): every ready flag of a workspace has a companion word right
# after it (flag index f -> words 2f, 2f + 1 of the flags region). Whoever sets a flag
# first stores the launch's fingerprint `fp` (ccl.device.fingerprint: odd, 31 bits) in its
# companion on the same rank, then signals (release: the companion is visible first); the
# waiter compares it after the wait and records CallMismatch on a difference. Each flag has
# one writer per launch, which writes it only after the reader acked the previous launch.
@triton.jit
def signal_call(flag, epoch, fp, rank, peer, heap_bases):
    """Set `peer`'s `flag` (a flag word of a fused workspace) to `epoch`, its companion to
    this call's fingerprint `fp` first."""
    tdl.store(flag + 1, tl.cast(fp, tl.int32), rank, peer, heap_bases)
    tdl.signal(flag, epoch, rank, peer, heap_bases)


@triton.jit
def wait_call(flag, epoch, fp, ctrl, rank, peer, OP: tl.constexpr,
              THREADS: tl.constexpr = 0):
    """Wait (bounded) until `flag` reaches `epoch`; True if it did in a call of this
    fingerprint `fp` (else CallMismatch is recorded, as the collectives' wait_for does).
    THREADS: who votes in the wait (tdl.wait)."""
    ok = tdl.wait(flag, epoch, ctrl, rank, peer, OP, THREADS)
    same = tl.load(flag + 1, volatile=True) == tl.cast(fp, tl.int32)
    if ok & (not same):
        tdl.record_error(ctrl, rank, peer, OP, tdl.KIND_MISMATCH)
    return ok & same


@triton.jit
def finish_program(sync, epoch, rank, world_size, heap_bases):
    """Every program calls this last. The last one out (tdl.last_program_out) rearms the
    tile queue, stores the epoch and acks it to every rank."""
    if tdl.last_program_out(sync + SYNC_DONE, tl.num_programs(0)):
        tl.store(sync + SYNC_QUEUE, 0)
        tl.store(sync + SYNC_EPOCH, epoch)
        for peer in range(world_size):
            tdl.signal(sync + SYNC_ACK + rank, epoch, rank, peer, heap_bases)
