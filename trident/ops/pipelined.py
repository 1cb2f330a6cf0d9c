"""The `pipelined` schedule of the fused ops, in the manner of PyTorch's async-TP
(torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter): the GEMM is
cut into world chunks of M, cuBLAS runs chunk i on the caller's stream while chunk i +- 1
moves on a second stream, and events join the two, so one call is capturable in a CUDA
graph.

- all_gather_matmul: chunk c is rank c's rows of A. Each rank first multiplies its own
  rows (no wait), while its copy stream pushes them into every peer's `gathered` heap
  buffer (ring order: rank - 1 first, the peer that needs them first). Then, chunk by
  chunk in ring order (rank + 1 first), a one-program kernel waits for the chunk's flag
  and cuBLAS multiplies it into its rows of `out`.
- matmul_reduce_scatter: chunk c is owner c's rows of the product. Each rank multiplies
  the chunks of the other owners first (rank + 1 first) into a staging buffer, and its
  copy stream pushes each to its owner's `recv` slot as soon as it is done, while the
  next chunk is multiplied; its own chunk, last, goes straight into its own slot. A
  reduce kernel then waits for every rank's slot, sums them in rank order (bitwise the
  same on every rank whatever the arrival order), adds the bias and stores `out`.
- matmul_all_reduce: the same with chunks of ceil(M / world) rows (M need not divide);
  the reducer also keeps its reduced chunk in a heap `result` buffer, and a gather kernel
  pulls the other owners' chunks into `out`.

The copies are a Triton kernel of COPY_PROGRAMS programs (16-byte vector stores into the
peer's heap; the other SMs stay with cuBLAS). Waits, poison and fingerprints follow the
collectives' contract (trident/ccl/device.py): every wait is bounded and records a
timeout / peer failure in the error word; the data a rank sends carries the call's
fingerprint (op, M and the shared size, dtype) and a receiver whose sender made another
call records CallMismatch; a copy whose wait failed moves nothing and flags nothing; the
kernel that finishes a call poisons `out` (NaN) when this rank's error word is set.

Flags (int32 words of the op's workspace, _common.Workspace.sync), one per (kind,
source rank), set to the call's epoch, never reset:
  READY     src's chunk for me is in my buffer (gathered / recv)
  DONE      I am done with your chunk in my buffer; matmul_all_reduce: also "my reduced
            chunk is in my result buffer"
  GATHERED  matmul_all_reduce: I have pulled your reduced chunk
A copy into a peer's buffer waits for that peer's DONE of the previous call; the reducer
of matmul_all_reduce waits for GATHERED of the previous call before rewriting `result`.
The epoch: a one-program kernel at the start of each call adds one to the workspace's
epoch word on the caller's stream; every later kernel of the call reads it (they run
after it: stream order, or the fork event of the copy stream), and the end of the call
joins the copy stream back, so the next call's increment follows them all.

Buffers are made when the plan is built (the op's heap workspace, the copy stream, its
events), so a call allocates nothing but its output. On the CPU emulation there are no
streams: the steps run one after another in the caller's thread, which keeps the same
order of waits and signals (a rank's pushes come before its waits, so nothing deadlocks).

When it wins: mid and large M, where the GEMM of a chunk is long enough to hide the
transfer of the next (async-TP's regime). Measured by `trident bench ops` (pipelined
rows beside fused, sequential and NCCL + cuBLAS); not measured on GPUs yet.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .. import language as tdl
from ..ccl.device import fingerprint
from ..runtime.errors import OP_CODES
from ..language.sync import CTRL_ERROR
from ..runtime.plans import Live, Plan
from ..runtime.triton_launch import Launch
from . import plain
from ._common import SYNC_EPOCH, SYNC_FLAGS, workspace

OPS = ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce")
READY = tl.constexpr(0)
DONE = tl.constexpr(1)
GATHERED = tl.constexpr(2)
KINDS = 3
RANKS = int(tdl.MAX_RANKS.value)
FP_WORDS = tl.constexpr(int(SYNC_FLAGS.value) + KINDS * RANKS)   # fingerprints by parity
NUM_FLAGS = KINDS * RANKS + KINDS * 2 * RANKS
# last_program_out counters, one per kernel that may run beside another: the copies (copy
# stream), the finish / reduce kernel and the all-reduce's gather (caller's stream: the
# gather can overlap the last copy of the copy stream)
COPY_COUNTER = tl.constexpr(3)
MAIN_COUNTER = tl.constexpr(4)
GATHER_COUNTER = tl.constexpr(5)
COPY_PROGRAMS = 16                  # SMs the copies take from cuBLAS on GPUs


# ---------------------------------------------------------------------------- device side
@triton.jit
def _tell(sync, kind: tl.constexpr, epoch, rank, peer, heap_bases, fp):
    """Set flag (kind, rank) on `peer` to `epoch` (release), after storing the call's
    fingerprint in its slot of this kind and parity there (fp 0: none)."""
    if fp != 0:
        slot = sync + FP_WORDS + (kind * 2 + epoch % 2) * 64 + rank
        tdl.store(slot, tl.cast(fp, tl.int32), rank, peer, heap_bases)
    tdl.signal(sync + SYNC_FLAGS + kind * 64 + rank, epoch, rank, peer, heap_bases)


@triton.jit
def _hear(sync, kind: tl.constexpr, epoch, src, ctrl, rank, fp, OP: tl.constexpr):
    """Wait (bounded, acquire) for flag (kind, src) to reach `epoch`; True if it did, in a
    call of the same fingerprint `fp` (else CallMismatch is recorded; fp 0: not compared)."""
    ok = tdl.wait(sync + SYNC_FLAGS + kind * 64 + src, epoch, ctrl, rank, src, OP)
    theirs = tl.load(sync + FP_WORDS + (kind * 2 + epoch % 2) * 64 + src, volatile=True)
    same = (theirs == tl.cast(fp, tl.int32)) | (fp == 0)
    if ok & (not same):
        tdl.record_error(ctrl, rank, src, OP, tdl.KIND_MISMATCH)
    return ok & same


@triton.jit
def _num_blocks(rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    """How many [BR, BC] blocks tile a [rows, cols] matrix (this program takes every
    num_programs-th from its id: `_block`)."""
    return tl.cdiv(rows, BR) * tl.cdiv(cols, BC)


@triton.jit
def _block(blk, rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    """(row indices [BR, 1], column indices [1, BC], mask) of block `blk` of a [rows, cols]
    matrix, blocks row-major."""
    nc = tl.cdiv(cols, BC)
    i = (blk // nc) * BR + tl.arange(0, BR)[:, None]
    j = (blk % nc) * BC + tl.arange(0, BC)[None, :]
    return i, j, (i < rows) & (j < cols)


@triton.jit
def _clean(ctrl):
    """Whether this rank's error word is clear (no wait of the call failed so far)."""
    return tl.load(ctrl + CTRL_ERROR, volatile=True) == 0


@triton.jit
def _begin_kernel(sync):
    """The call's epoch: one more than the last call's (one program, caller's stream)."""
    tl.store(sync + SYNC_EPOCH, tl.load(sync + SYNC_EPOCH, volatile=True) + 1)


@triton.jit
def _push_kernel(src, stride_src, dst, sync, ctrl, heap_bases, rank, peer, rows, cols, fp,
                 OP: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """Copy src[:rows, :cols] (rows `stride_src` apart) into `peer`'s copy of the
    contiguous heap buffer `dst`, once `peer` is done with it (its DONE of the last
    call), then set READY there; nothing is copied or flagged if a wait failed."""
    epoch = tl.load(sync + SYNC_EPOCH, volatile=True)
    ok = _hear(sync, DONE, epoch - 1, peer, ctrl, rank, 0, OP)
    if ok:
        for blk in range(tl.program_id(0), _num_blocks(rows, cols, BR, BC), tl.num_programs(0)):
            i, j, mask = _block(blk, rows, cols, BR, BC)
            x = tl.load(src + i.to(tl.int64) * stride_src + j, mask=mask)
            tdl.store(dst + i.to(tl.int64) * cols + j, x, rank, peer, heap_bases, mask=mask)
    if tdl.last_program_out(sync + COPY_COUNTER, tl.num_programs(0)):
        if _clean(ctrl):
            _tell(sync, READY, epoch, rank, peer, heap_bases, fp)


@triton.jit
def _wait_kernel(sync, ctrl, rank, src, fp, OP: tl.constexpr):
    """Hold the caller's stream until src's chunk is here (all_gather_matmul)."""
    _hear(sync, READY, tl.load(sync + SYNC_EPOCH, volatile=True), src, ctrl, rank, fp, OP)


@triton.jit
def _poison_rows(out, stride_om, rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    """NaN into this program's blocks of out[:rows, :cols]."""
    for blk in range(tl.program_id(0), _num_blocks(rows, cols, BR, BC), tl.num_programs(0)):
        i, j, mask = _block(blk, rows, cols, BR, BC)
        ptrs = out + i.to(tl.int64) * stride_om + j
        x = tl.load(ptrs, mask=mask).to(tl.float32)
        tl.store(ptrs, (x * float("nan")).to(out.dtype.element_ty), mask=mask)


@triton.jit
def _finish_kernel(out, stride_om, sync, ctrl, heap_bases, rank, world_size, rows, cols,
                   BR: tl.constexpr, BC: tl.constexpr):
    """all_gather_matmul, after every GEMM: tell each peer this rank is done with its
    chunk (DONE), and poison `out` if a wait of the call failed."""
    epoch = tl.load(sync + SYNC_EPOCH, volatile=True)
    if not _clean(ctrl):
        _poison_rows(out, stride_om, rows, cols, BR, BC)
    if tdl.last_program_out(sync + MAIN_COUNTER, tl.num_programs(0)):
        if _clean(ctrl):
            for p in range(1, world_size):
                _tell(sync, DONE, epoch, rank, (rank + p) % world_size, heap_bases, 0)


@triton.jit
def _reduce_kernel(recv, slot, out, stride_om, row0, result, bias, sync, ctrl, heap_bases,
                   rank, world_size, rows, cols, fp, HAS_BIAS: tl.constexpr,
                   ALL_REDUCE: tl.constexpr, OP: tl.constexpr, BR: tl.constexpr,
                   BC: tl.constexpr):
    """out[row0:row0 + rows] = sum over ranks s (in rank order) of recv[s] (slots `slot`
    elements apart) + bias, once every slot is in (READY); all-reduce: also into `result`
    (once every peer pulled the last one: GATHERED). Then DONE to every peer: its slot
    here is free (and `result` is ready)."""
    epoch = tl.load(sync + SYNC_EPOCH, volatile=True)
    ok = tl.cast(1, tl.int1)
    for p in range(1, world_size):
        src = (rank + p) % world_size
        ok = ok & _hear(sync, READY, epoch, src, ctrl, rank, fp, OP)
        if ALL_REDUCE:
            ok = ok & _hear(sync, GATHERED, epoch - 1, src, ctrl, rank, 0, OP)
    for blk in range(tl.program_id(0), _num_blocks(rows, cols, BR, BC), tl.num_programs(0)):
        i, j, mask = _block(blk, rows, cols, BR, BC)
        offs = i.to(tl.int64) * cols + j
        acc = tl.zeros((BR, BC), dtype=tl.float32)
        src = recv + offs
        for s in range(world_size):          # rank order: bitwise alike on every rank
            acc += tl.load(src, mask=mask).to(tl.float32)
            src += slot
        if HAS_BIAS:
            acc += tl.load(bias + j, mask=j < cols, other=0.0).to(tl.float32)
        y = acc.to(out.dtype.element_ty)
        y = tl.where(ok, y, (acc * float("nan")).to(out.dtype.element_ty))
        tl.store(out + (row0 + i).to(tl.int64) * stride_om + j, y, mask=mask)
        if ALL_REDUCE:
            tl.store(result + offs, y, mask=mask)
    if tdl.last_program_out(sync + MAIN_COUNTER, tl.num_programs(0)):
        if _clean(ctrl):
            for p in range(1, world_size):
                _tell(sync, DONE, epoch, rank, (rank + p) % world_size, heap_bases, fp)


@triton.jit
def _gather_kernel(result, out, stride_om, sync, ctrl, heap_bases, rank, world_size, M,
                   chunk, cols, fp, OP: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """matmul_all_reduce: pull every other owner's reduced chunk (rows c * chunk ...) from
    its `result` into `out` once it is there (its DONE), then tell it (GATHERED)."""
    epoch = tl.load(sync + SYNC_EPOCH, volatile=True)
    for k in range(1, world_size):
        owner = (rank + k) % world_size
        ok = _hear(sync, DONE, epoch, owner, ctrl, rank, fp, OP)
        first = owner * chunk
        rows = tl.minimum(tl.maximum(M - first, 0), chunk)
        for blk in range(tl.program_id(0), _num_blocks(rows, cols, BR, BC), tl.num_programs(0)):
            i, j, mask = _block(blk, rows, cols, BR, BC)
            if ok:
                y = tdl.load(result + i.to(tl.int64) * cols + j, rank, owner, heap_bases,
                             mask=mask)
            else:
                y = tl.load(out + (first + i).to(tl.int64) * stride_om + j, mask=mask)
                y = (y.to(tl.float32) * float("nan")).to(y.dtype)
            tl.store(out + (first + i).to(tl.int64) * stride_om + j, y, mask=mask)
    if tdl.last_program_out(sync + GATHER_COUNTER, tl.num_programs(0)):
        if _clean(ctrl):
            for k in range(1, world_size):
                _tell(sync, GATHERED, epoch, rank, (rank + k) % world_size, heap_bases, 0)


# ---------------------------------------------------------------------------- host side
_copy_streams: dict = {}            # device index -> the copy stream of its ranks' calls


def _streams(ctx):
    """(the copy stream, a context entering it) on GPUs; (None, nullcontext) on the CPU,
    where a call's steps run in order in the caller's thread."""
    if ctx.backend != "cuda":
        return None, contextlib.nullcontext
    index = ctx.device.index if ctx.device.index is not None else torch.cuda.current_device()
    if index not in _copy_streams:
        _copy_streams[index] = torch.cuda.Stream(ctx.device, priority=-1)
    side = _copy_streams[index]
    return side, lambda: torch.cuda.stream(side)


def _block_shape(ctx) -> tuple[int, int, dict]:
    """(rows, columns) of a copy/reduce block and launch options, by backend."""
    if ctx.backend == "cuda":
        return 8, 256, dict(num_warps=4)
    return 4, 32, {}


class _Events:
    """Events of one plan (GPUs): `mark(stream)` records the next one on `stream` and
    returns it; nothing on the CPU."""

    def __init__(self, ctx, count: int):
        self.events = [torch.cuda.Event() for _ in range(count)] if ctx.backend == "cuda" \
            else []
        self.next = 0

    def start(self) -> None:
        self.next = 0

    def mark(self, stream):
        if stream is None:
            return None
        ev = self.events[self.next]
        self.next += 1
        ev.record(stream)
        return ev


def _wait(stream, event) -> None:
    if stream is not None:
        stream.wait_event(event)


def _matmul(x, w, out, bias=None) -> None:
    """out = x @ w.T (+ bias, already in x's dtype): cuBLAS into the given rows."""
    if x.shape[0] == 0:
        return
    plain.matmul(x, w, bias, out)


def build(ctx, plan: Plan, op: str, a, w, bias, out, **options) -> None:
    """Add the pipelined schedule's step to `plan` (inputs checked by the caller; `out` is
    the call's tensor 3). The registry's build (trident/ops/schedules.py)."""
    if options:
        raise TypeError(f"{op}: the pipelined schedule takes no options, got {sorted(options)}")
    if op not in OPS:
        raise ValueError(f"pipelined: op must be one of {OPS}, got {op!r}")
    {"all_gather_matmul": _all_gather, "matmul_reduce_scatter": _reduce_scatter,
     "matmul_all_reduce": _reduce_scatter}[op](ctx, plan, op, a, w, bias, out)


def _all_gather(ctx, plan, op, a, w, bias, out) -> None:
    world, rank = ctx.world_size, ctx.rank
    m_local, K = a.shape
    M, N = m_local * world, w.shape[0]
    ws = workspace(ctx, f"pipelined {op}", max(M * K * a.element_size(), 1), NUM_FLAGS)
    gathered = ws.view(a.dtype, world, m_local, K)
    code = OP_CODES[op]
    fp = fingerprint(_push_kernel, op, M, K, str(a.dtype))
    br, bc, opts = _block_shape(ctx)
    copies = COPY_PROGRAMS if ctx.backend == "cuda" else 2
    begin = Launch(_begin_kernel, (1,), (ws.sync,), {}, plan.tensors)
    # my rows into every peer's gathered[rank], the peer that needs them first first
    pushes = [Launch(_push_kernel, (copies,), (a, a.stride(0), gathered[rank], ws.sync,
                                                ctx.ctrl, ctx.heap_bases, rank,
                                                (rank - i) % world, m_local, K, fp),
                     dict(OP=code, BR=br, BC=bc, **opts), plan.tensors)
              for i in range(1, world)]
    srcs = [(rank + i) % world for i in range(1, world)]
    waits = [Launch(_wait_kernel, (1,), (ws.sync, ctx.ctrl, rank, s, fp), dict(OP=code),
                    plan.tensors) for s in srcs]
    finish = Launch(_finish_kernel, (4 if ctx.backend == "cuda" else 1,),
                    (Live(3), out.stride(0), ws.sync, ctx.ctrl, ctx.heap_bases, rank, world,
                     M, N), dict(BR=br, BC=bc, **opts), plan.tensors)
    side, on_side = _streams(ctx)
    events = _Events(ctx, 2)
    # a bias in another dtype than a: a copy made now, refreshed per call (addmm needs a's)
    cast = torch.empty(N, dtype=a.dtype, device=a.device) \
        if bias is not None and bias.dtype != a.dtype else None

    def step(ts):
        x, wt, b, o = ts
        if cast is not None:
            b = cast.copy_(b)
        main = torch.cuda.current_stream(ctx.device) if side is not None else None
        events.start()
        begin(ts)
        fork = events.mark(main)
        with on_side():
            _wait(side, fork)
            for p in pushes:
                p(ts)
            done = events.mark(side)
        _matmul(x, wt, o[rank * m_local:(rank + 1) * m_local], b)
        for s, wait in zip(srcs, waits):
            wait(ts)
            _matmul(gathered[s], wt, o[s * m_local:(s + 1) * m_local], b)
        finish(ts)
        _wait(main, done)
    plan.add(step, graphable=False)


def _reduce_scatter(ctx, plan, op, a, w, bias, out) -> None:
    world, rank = ctx.world_size, ctx.rank
    all_reduce = op == "matmul_all_reduce"
    M, N = a.shape[0], w.shape[0]
    chunk = triton.cdiv(M, world) if all_reduce else M // world
    rows = [max(0, min(M - c * chunk, chunk)) for c in range(world)]
    slot = chunk * N
    # heap: recv[world] slots, staging send[world], result (all-reduce)
    ws = workspace(ctx, f"pipelined {op}",
                   max((2 * world + 1) * slot * a.element_size(), 1), NUM_FLAGS)
    data = ws.view(a.dtype, 2 * world + 1, chunk, N)
    recv, send, result = data[:world], data[world:2 * world], data[2 * world]
    code = OP_CODES[op]
    fp = fingerprint(_push_kernel, op, M, N, str(a.dtype))
    br, bc, opts = _block_shape(ctx)
    copies = COPY_PROGRAMS if ctx.backend == "cuda" else 2
    owners = [(rank + i) % world for i in range(1, world)]
    begin = Launch(_begin_kernel, (1,), (ws.sync,), {}, plan.tensors)
    pushes = [Launch(_push_kernel, (copies,), (send[c], N, recv[rank], ws.sync, ctx.ctrl,
                                                ctx.heap_bases, rank, c, rows[c], N, fp),
                     dict(OP=code, BR=br, BC=bc, **opts), plan.tensors)
              for c in owners]
    programs = max(1, min(ctx.usable_sms or 1, 128)) if ctx.backend == "cuda" else 2
    # the reducer writes its own rows of out (all-reduce: the gather the others')
    reduce = Launch(_reduce_kernel, (programs,),
                    (recv, slot, Live(3), out.stride(0), rank * chunk if all_reduce else 0,
                     result, bias if bias is not None else recv, ws.sync, ctx.ctrl,
                     ctx.heap_bases, rank, world, rows[rank], N, fp),
                    dict(HAS_BIAS=bias is not None, ALL_REDUCE=all_reduce, OP=code, BR=br,
                         BC=bc, **opts), plan.tensors)
    gather = Launch(_gather_kernel, (copies,),
                    (result, Live(3), out.stride(0), ws.sync, ctx.ctrl, ctx.heap_bases,
                     rank, world, M, chunk, N, fp),
                    dict(OP=code, BR=br, BC=bc, **opts), plan.tensors) if all_reduce else None
    into = [send[c][:rows[c]] for c in range(world)]
    into[rank] = recv[rank][:rows[rank]]
    side, on_side = _streams(ctx)
    events = _Events(ctx, world + 1)

    def step(ts):
        x, wt, _, _ = ts
        main = torch.cuda.current_stream(ctx.device) if side is not None else None
        events.start()
        begin(ts)
        for c, push in zip(owners, pushes):
            _matmul(x[c * chunk:c * chunk + rows[c]], wt, into[c])
            ready = events.mark(main)
            with on_side():
                _wait(side, ready)
                push(ts)
        _matmul(x[rank * chunk:rank * chunk + rows[rank]], wt, into[rank])
        reduce(ts)
        if gather is not None:
            gather(ts)
        if side is not None and owners:        # join the copy stream (forked by a push)
            with on_side():
                done = events.mark(side)
            _wait(main, done)
    plan.add(step, graphable=False)


from .schedules import register  # noqa: E402  (the registry imports this module)

# auto=True, cost=None: "auto" takes it only where a measured table (trident tune --ops,
# schedule_table.json) timed it fastest, never from the cost model's guess
register("pipelined", build, ops=OPS, auto=True, cost=None,
         about="cuBLAS per chunk of M while the next chunk moves on a copy stream "
               "(async-TP style)")
