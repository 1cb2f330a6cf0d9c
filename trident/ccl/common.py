"""Host side that every collective shares: input checks, the per-context state (epoch
counter and flags), what the ranks agree on once (`Agreed`), scratch and staging buffers
on the heap, word views and launch sizes.

Rank-independent decisions. Everything that shapes a collective's protocol -- the
algorithm, the word width, the workspaces a call creates (collectively: each is a heap
allocation and a host barrier on every rank), the launch size, the chunking -- must come
out the same on every rank. So it is derived only from what every rank knows alike: the
op, shapes and dtypes (which must agree across ranks; debug mode checks them), options,
world size and backend, and the facts of `Agreed`. Facts of one rank -- where its
tensors lie on its heap (offsets, alignment, whether on the heap at all), its data
pointers, all_to_all's splits -- may only decide what changes nothing the ranks exchange
or allocate together: e.g. whether this rank copies its tensor into a staging buffer
that every rank has made anyway. The kernels learn the peers' heap offsets at run time
(device.py, "Heap offsets")."""
from __future__ import annotations

import torch
import triton

from . import device, nccl, selector

REDUCE_OPS = {"sum": 0, "max": 1, "min": 2}
# floats accumulate in fp32; integers in their own type, wrapping around as torch's do
REDUCE_DTYPES = (torch.bfloat16, torch.float16, torch.float32,
                 torch.int8, torch.uint8, torch.int32, torch.int64)

# Launch sizes. GPU: 16 KiB per program per step (16-byte vectors, 4 per thread with 8
# warps), up to 128 programs (about one per SM of an H100/H200). The interpreter runs
# programs one by one in Python, so there fewer, smaller programs are cheaper.
GPU_BLOCK_BYTES, GPU_MAX_PROGRAMS, GPU_NUM_WARPS = 16384, 128, 8
CPU_BLOCK_BYTES, CPU_MAX_PROGRAMS = 1024, 2
ALIGN = 64          # elements: slot strides and segment starts stay 16-byte aligned


class State:
    """Per-context collective state: epoch counter and flags (see device.py)."""

    def __init__(self, ctx):
        self.sync = ctx.zeros(2, dtype=torch.int64)
        self.flags = ctx.zeros(device.NUM_REGIONS * device.MAX_RANKS
                               * device.MAX_PROGRAMS, dtype=torch.int64)
        self.offsets = ctx.zeros(device.MAX_RANKS, dtype=torch.int64)   # see device.py

    def reset(self):
        for t in (self.sync, self.flags, self.offsets):
            t.zero_()


def state(ctx) -> State:
    return ctx.workspace("ccl.state", State)


class Agreed:
    """Facts that shape every collective but are read by each rank for itself, agreed by
    all ranks in one host exchange at the context's first collective (`agreed`, called
    before its plan is built: a context's first collective builds a plan on every rank,
    so the exchange is at the same call everywhere):
    - sms: the SMs a grid may fill (GPUs). Each rank's share of its GPU (ctx.usable_sms)
      can differ -- 3 ranks on 2 GPUs share one GPU two ways and have the other alone;
      MPS percentages are per process -- while programs wait on the programs of the same
      id on their peers, so every rank must launch the same grid: the smallest share
      (resident everywhere);
    - nccl: whether the "nccl" algorithm can run: only if it can on every rank (a rank
      alone on its GPU would pick it where its peers cannot);
    - heap_size: the smallest heap (it sizes the staging buffers every rank makes);
    - tables: None if every rank's selector reads the same tables for this world size
      (a tuned file on the machine, read by each process), else what each rank read:
      "auto" then refuses to choose (`check_tables`), since ranks would choose apart;
    - debug mode must be on for every rank or none (it adds a host exchange to every
      call): else `error`, raised on every rank at this and every later collective."""

    def __init__(self, ctx):
        self.digest, self.source = selector.fingerprint(ctx.world_size)
        self.mine = [(ctx.usable_sms or 0) if ctx.backend == "cuda" else 0,
                     int(nccl.available(ctx)), int(bool(ctx.debug)), int(ctx.heap_size),
                     self.digest]
        self.error = None
        self.pending = True             # the exchange follows the workspace's barrier

    def exchange(self, ctx) -> None:
        self.pending = False
        rows, sources = ctx.host_exchange("ccl.agree", self.mine, detail=self.source)
        rows = [[int(v) for v in row[:len(self.mine)]] for row in rows]
        self.sms = min(row[0] for row in rows) if ctx.backend == "cuda" else None
        self.nccl = all(row[1] for row in rows)
        self.heap_size = min(row[3] for row in rows)
        self.tables = None
        if len({row[4] for row in rows}) > 1:
            names = sources or [self.source] * len(rows)
            self.tables = "; ".join(f"rank {r}: {names[r]} (digest {row[4] & 0xffffffff:08x})"
                                    for r, row in enumerate(rows))
        debug = [r for r, row in enumerate(rows) if row[2]]
        if debug and len(debug) < len(rows):
            self.error = (f"debug mode is on for rank(s) {debug} only (td.init(debug=...) or "
                          f"TRIDENT_DEBUG): it adds a host check to every collective, so it "
                          f"must be on for every rank or for none")


def agreed(ctx) -> Agreed:
    """This context's `Agreed` facts: a workspace (so a rank that never comes is named
    with the op by the workspace's barrier), exchanged right after it is made."""
    facts = ctx.workspace("ccl.agreed", Agreed)
    if facts.pending:
        facts.exchange(ctx)
    if facts.error is not None:
        raise ValueError(facts.error)
    return facts


def check_tables(ctx, op: str) -> None:
    """Raise ValueError if the ranks' selectors read different tables (see Agreed): an
    "auto" call would then run different algorithms on different ranks."""
    why = agreed(ctx).tables
    if why is not None:
        raise ValueError(f"{op}: algorithm 'auto' needs the same selector tables on every "
                         f"rank, but the ranks loaded different ones ({why}); give every rank "
                         f"the same TRIDENT_CACHE_DIR (or rerun `trident tune`), or pass "
                         f"algorithm= by name")


def _size_class(nbytes: int) -> int:
    return max(1 << 16, 1 << (max(nbytes, 1) - 1).bit_length())


def scratch(ctx, nbytes: int, dtype: torch.dtype, key: str = "scratch") -> torch.Tensor:
    """A heap buffer of at least `nbytes`, viewed as `dtype`. One per size class (power of
    two), kept for the context's life: the same on every rank, no reallocation."""
    size = _size_class(nbytes)
    buf = ctx.workspace((f"ccl.{key}", size), lambda c: c.empty(size, dtype=torch.uint8))
    return buf.view(dtype)


def _mirror(plan, index: int, buf: torch.Tensor) -> torch.Tensor:
    """`buf` viewed as the call's tensor `index` (same dtype and shape)."""
    user = plan.tensors[index]
    return buf.view(torch.uint8).view(user.dtype).view(user.shape)


def _copy_in(plan, index: int, buf: torch.Tensor) -> None:
    """Add a step that copies the call's tensor `index` into `buf`."""
    mirror = _mirror(plan, index, buf)
    plan.add(lambda ts: mirror.copy_(ts[index]))


def _copy_back(plan, index: int, buf: torch.Tensor) -> None:
    """Add a step that copies `buf` back into the call's tensor `index`."""
    mirror = _mirror(plan, index, buf)
    plan.add(lambda ts: ts[index].copy_(mirror))


# Staging buffers (see `stage`): at most this many bytes, or 1/16 of the heap if less.
STAGE_BYTES = 1 << 20


def stage_buffer(ctx, key: str) -> torch.Tensor:
    """The staging buffer of `key` (uint8, on the heap): made on every rank by the first
    call that stages through `key`, whatever lies where (see `stage`). Its size depends
    only on Agreed.heap_size: min(STAGE_BYTES, the power of two at or below heap / 16)."""
    size = min(STAGE_BYTES, 1 << max(0, (agreed(ctx).heap_size // 16).bit_length() - 1))
    return ctx.workspace((f"ccl.{key}", size), lambda c: c.empty(size, dtype=torch.uint8))


def stage(ctx, plan, t: torch.Tensor, index: int, key: str, copy_in: bool = True) -> torch.Tensor:
    """`t` itself when it lies on the heap, else a heap buffer of its size for the kernel
    that needs it there (`t` is a flat view of the call's tensor `index`). With copy_in,
    the plan copies the call's tensor into the buffer first. See `unstage`.

    Making a buffer is collective (a workspace), so which buffers a call makes must not
    depend on whether this rank's tensor is on the heap -- a peer's may not be (or, for
    all_to_all, be of another size). So every call makes the staging buffer of `key`
    (`stage_buffer`, bounded: at most STAGE_BYTES) on every rank, and a rank whose tensor
    is not on the heap and fits uses it; a rank whose tensor is on the heap leaves it
    unused (the kernels find each rank's tensor wherever it lies: "Heap offsets" in
    device.py). Larger tensors that are not on the heap get a buffer of their size class
    (`scratch`), made only by the ranks that need one: making it on every rank would cost
    every heap tensor as much heap again. So above the staging buffer's size, a call must
    pass the tensor on the heap on every rank or on none -- counting a 1-byte heap view
    at an address that is not a whole word (word_type) as not on the heap -- and
    all_to_all's outputs that are not on the heap must be in the same size class on every
    rank; otherwise the ranks raise HeapMismatchError, or the ones that went on time out,
    naming the op."""
    small = stage_buffer(ctx, key)              # on every rank, whatever t is
    if ctx.is_symmetric(t):
        return t
    nbytes = t.numel() * t.element_size()
    whole = small if nbytes <= small.numel() else scratch(ctx, nbytes, torch.uint8, key)
    buf = whole[:nbytes].view(t.dtype)
    if copy_in:
        _copy_in(plan, index, buf)
    return buf


def unstage(plan, index: int, t: torch.Tensor, staged: torch.Tensor) -> None:
    """After the kernel's step: copy a staged buffer back into `t`, the flat view that was
    staged of the call's tensor `index` -- or as_words' aligned stand-in for it, which
    as_words' finish() copies into the call's tensor afterwards: the result must go into
    the stand-in then (written into the call's tensor, it would be overwritten by the
    stand-in's stale copy: all_to_all push's output at an odd byte offset did)."""
    if staged is t:
        return
    if t.numel() and t.data_ptr() != plan.tensors[index].data_ptr():
        plan.add(lambda ts: t.copy_(staged))
    else:
        _copy_back(plan, index, staged)


def heap_offset(ctx, t: torch.Tensor) -> int:
    """Byte offset of heap tensor `t` from this rank's heap base (Context.heap_offset)."""
    return ctx.heap_offset(t)


def check_tensor(ctx, t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != ctx.device:
        raise ValueError(f"{name} is on {t.device}, but this rank's context is on {ctx.device}")
    ctx.check_not_freed(t, name)
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")


def check_reduce(t: torch.Tensor, name: str, op: str) -> int:
    if t.dtype not in REDUCE_DTYPES:
        raise TypeError(f"{name}: reductions support bfloat16, float16, float32, int8, uint8, "
                        f"int32 and int64, got {t.dtype}")
    if op not in REDUCE_OPS:
        raise ValueError(f"{name.partition(':')[0]}: op must be one of {sorted(REDUCE_OPS)}, "
                         f"got {op!r}")
    return REDUCE_OPS[op]


def check_same_dtype(a: torch.Tensor, b: torch.Tensor, names: str) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{names} must have the same dtype, got {a.dtype} and {b.dtype}")


def word_type(elem_size: int, nbytes=(), unit: int = 0) -> tuple[torch.dtype, int]:
    """(dtype, bytes) of as_words' word: the widest integer type (int32/int16/int8) that
    tiles every size in `nbytes` and `unit` bytes and, for elements of 2 bytes or more,
    an element of `elem_size` bytes. It depends on the dtype and sizes, which the ranks
    agree on, never on where a tensor lies.

    Never wider than an element of 2 bytes or more: torch starts every tensor at a
    multiple of its element size, so every rank's tensor -- wherever it lies, e.g. a heap
    view an odd number of elements in -- is aligned to the word and nothing is staged for
    alignment. (int32 words for an fp16 tensor of even size left a view 2 bytes off a
    4-byte boundary unaligned on one rank only: that rank staged it, making a staging
    workspace its peers did not: HeapMismatchError.) int16 words keep the copy loops'
    16-byte accesses on GPUs; int8 words do not (tests/compile/sm90.py compiles them to
    scalar loads and stores), so 1-byte elements move as the widest word their sizes
    allow, and a view at an address that is not a multiple of it is copied by its rank
    alone (as_words) and, where the algorithm needs it on the heap, staged (`stage`: the
    same buffers on every rank up to the staging buffer's size)."""
    return next((w, s) for w, s in ((torch.int32, 4), (torch.int16, 2), (torch.int8, 1))
                if (elem_size == 1 or elem_size % s == 0) and unit % s == 0
                and all(n % s == 0 for n in nbytes))


def as_words(ctx, plan, specs, unit: int = 0):
    """Flat views of the call's tensors as integer words (`word_type`: the widest of
    int32/int16/int8 that tiles their element and `unit` bytes, e.g. a row), so data
    movement works for any dtype (bool, fp8, complex, ...).

    specs: (tensor, index among the call's tensors, is an input, is an output). The width
    depends only on the dtype and sizes, which every rank agrees on, never on where a
    tensor lies: ranks that chose different widths would run different kernels. A tensor
    whose data pointer is not a multiple of the word (only 1-byte dtypes: see word_type)
    is copied through an aligned plain buffer (in before the kernel if an input; back
    after it if an output: call the returned `finish()` once the kernel's step is added):
    a copy of this rank's own, which changes nothing the ranks share; its heap staging,
    if the algorithm needs one, is `stage`'s. Returns (views, finish).

    A view's word width needs its storage offset to be whole words, not only its data
    pointer: an empty tensor's data_ptr() is 0 wherever it lies (a zero-row view at an odd
    byte offset into a heap allocation passed the pointer check and failed torch's view),
    so an empty tensor becomes an empty word tensor (nothing is read or written through
    it), and a tensor whose storage does not start on a word is copied like a misaligned
    one. Both are this rank's own choices, as the copy above.
    """
    nbytes = [t.numel() * t.element_size() for t, *_ in specs]
    wide, size = word_type(min(t.element_size() for t, *_ in specs), nbytes, unit)
    views, back = [], []
    for (t, index, is_in, is_out), n in zip(specs, nbytes):
        if n == 0:
            views.append(torch.empty(0, dtype=wide, device=t.device))
            continue
        flat = t.reshape(-1).view(torch.uint8)
        if flat.data_ptr() % size or flat.storage_offset() % size:
            buf = torch.empty(n, dtype=torch.uint8, device=ctx.device)
            if is_in:
                _copy_in(plan, index, buf)
            if is_out:
                back.append((index, buf))
            flat = buf
        views.append(flat.view(wide))

    def finish():
        for index, buf in back:
            _copy_back(plan, index, buf)
    return views, finish


def round_up(n: int, m: int = ALIGN) -> int:
    return (n + m - 1) // m * m


def launch_size(ctx, n: int, elem_size: int, block=None, programs=None) -> tuple[int, int]:
    """(BLOCK elements, number of programs) for a kernel over `n` elements per program
    loop; block/programs override (tests use them to force several steps)."""
    gpu = ctx.backend == "cuda"
    block = block_size(ctx, elem_size, block)
    check_launch(block, programs)
    # on a GPU shared by several ranks, at most the rank's share of the SMs, so that every
    # rank's programs are resident at once (trident/runtime/placement.py) -- the smallest share of
    # any rank (Agreed.sms): programs wait on the programs of the same id on their peers,
    # so every rank launches the same grid. The rest depends on sizes and options only.
    limit = programs or (min(GPU_MAX_PROGRAMS, agreed(ctx).sms) if gpu else CPU_MAX_PROGRAMS)
    return block, max(1, min(limit, triton.cdiv(n, block)))


def block_size(ctx, elem_size: int, block=None) -> int:
    """launch_size's block: `block`, or the default for elements of `elem_size` bytes."""
    if block is None:
        block = max(16, (GPU_BLOCK_BYTES if ctx.backend == "cuda" else CPU_BLOCK_BYTES)
                    // elem_size)
    return block


def check_launch(block=None, programs=None, op: str = "") -> None:
    """The launch-size overrides' checks: launch_size makes them, and so does a collective
    that launches no kernel (one rank, empty tensors), so that a bad override is rejected
    the same way whether or not a kernel runs. `op` names the call in the message."""
    where = f"{op}: " if op else ""
    if block is not None and (block < 1 or block & (block - 1)):
        raise ValueError(f"{where}block must be a power of two, got {block}")
    if programs is not None and (isinstance(programs, bool) or not isinstance(programs, int)
                                 or not 1 <= programs <= device.MAX_PROGRAMS):
        # 0 is refused, not read as "the default" (None is the default)
        raise ValueError(f"{where}programs must be an int in 1..{device.MAX_PROGRAMS} (or None "
                         f"for the default), got {programs!r}")


WARPS = (1, 2, 4, 8, 16, 32)


def kernel_options(ctx, warps=None) -> dict:
    """Launch options: GPU_NUM_WARPS warps per program on GPUs, or `warps` (a knob: fewer
    warps with more programs, or more warps with a larger block; the interpreter ignores
    it, but it is checked there too)."""
    check_warps(warps)
    return {"num_warps": warps or GPU_NUM_WARPS} if ctx.backend == "cuda" else {}


def pdl_options(ctx, on: bool) -> dict:
    """The launch options of a kernel written for programmatic dependent launch (PDL: its
    first act is tdl.wait_previous_kernel(), lamport.py's docstring says why): its PDL
    constexpr, and launch_pdl where the GPU has it (sm_90+, and `on`: the caller's A/B
    knob, lamport.PDL or moe/plans.py's PDL); never launch_pdl on the CPU emulation."""
    on = on and ctx.backend == "cuda" and torch.cuda.get_device_capability(ctx.device)[0] >= 9
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


def check_warps(warps=None) -> None:
    """The warps knob's check (kernel_options makes it; so does a call without a kernel)."""
    if warps is not None and warps not in WARPS:
        raise ValueError(f"warps must be one of {WARPS}, got {warps!r}")


# ---------------------------------------------------------------------------- launches
# The host halves of the two kernel skeletons the collectives share. Each passes the
# skeleton's arguments in its order, around the algorithm's own (`before`, `after`).
def launch_push(ctx, plan, kernel, before: tuple, after: tuple, n: int, dtype: torch.dtype,
                fp: tuple, block=None, programs=None, slots: int | None = None,
                **constexprs) -> None:
    """Scratch push (all_gather/push.py, all_reduce/one_shot.py, reduce_scatter/push.py,
    broadcast/push.py): every rank stores its `n` elements of `dtype` into its slot of
    its peers' scratch (this launch's half: device.scratch_half), then reads the slots.
    The kernel takes (*before, scratch, flags, sync, ctrl, heap_bases, trace_buf, rank,
    world_size, *after, n, stride, half, fp, ..., BLOCK, TRACE); `slots` per half: the
    world size unless given (broadcast: 1); fp: the fingerprint's parts."""
    from ..trace import kernel_args
    stride = round_up(n)
    count = ctx.world_size if slots is None else slots
    buf = scratch(ctx, 2 * count * stride * dtype.itemsize, dtype)
    st = state(ctx)
    block, grid = launch_size(ctx, n, dtype.itemsize, block, programs)
    trace_buf, trace = kernel_args(ctx)
    plan.launch(
        kernel, (grid,), *before, buf, st.flags, st.sync, ctx.ctrl, ctx.heap_bases, trace_buf,
        ctx.rank, ctx.world_size, *after, n, stride, buf.numel() // 2,
        device.fingerprint(kernel, *fp), BLOCK=block, TRACE=trace, **constexprs,
        **kernel_options(ctx))


def launch_on_heap(ctx, plan, kernel, before: tuple, buf: torch.Tensor, after: tuple,
                   fp: tuple, block: int, grid: int, warps=None, **constexprs) -> None:
    """Peer access to a heap buffer (all_gather/pull.py, all_reduce/two_shot.py,
    reduce_scatter/pull.py): the peers read or write `buf` (the call's tensor, or its
    staging copy) at its heap offset. The kernel takes (*before, buf, offsets,
    heap_offset, flags, sync, ctrl, heap_bases, trace_buf, rank, *after, fp, WORLD=,
    WORD=, ..., BLOCK=, TRACE=); fp: the fingerprint's parts."""
    from ..trace import kernel_args
    st = state(ctx)
    trace_buf, trace = kernel_args(ctx)
    plan.launch(
        kernel, (grid,), *before, buf, st.offsets, heap_offset(ctx, buf), st.flags, st.sync,
        ctx.ctrl, ctx.heap_bases, trace_buf, ctx.rank, *after, device.fingerprint(kernel, *fp),
        WORLD=ctx.world_size, WORD=buf.element_size(), BLOCK=block, TRACE=trace,
        **constexprs, **kernel_options(ctx, warps))
