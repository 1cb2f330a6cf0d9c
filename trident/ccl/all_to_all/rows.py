"""What the all_to_all algorithms share: the split table the kernels read, the check that
out and inp do not overlap, the loop that moves a run of rows, and how the programs of a
launch are shared out among the (sender, receiver) pairs.

Pairs and programs. The rows that rank s sends to rank d (a "pair") are cut into blocks
of BLOCK elements, handed to `pair_programs(count)` programs of the launch: the pair's
program v (0 <= v < U) moves blocks v, v + U, v + 2U, ... and then sets one flag on d,
(DATA, s, its program id), that d's program of the same id waits for. U depends only on
the pair's row count, which both ends know (the sender from in_splits, the receiver from
out_splits or from a count that travels with the data), so no program waits for a flag
that no program sets, and programs that have nothing to move for a pair neither signal
nor wait. Program v = 0 of every pair signals even when the pair has no rows: each rank
waits for at least one signal of each peer per launch (the rule "Scratch halves" in
ccl/device.py relies on).

Flags are the collectives' flags (ccl/device.py: per phase, source rank and program);
`pair_flag` names one of another program of the same launch, which device.notify and
wait_for (always the caller's own program) cannot.
"""
import torch
import triton
import triton.language as tl

import trident.language as tdl

from ..device import MAX_PROGRAMS, MAX_RANKS


def check_no_overlap(out: torch.Tensor, inp: torch.Tensor) -> None:
    """all_to_all cannot work in place: rows land in other ranks' (and this rank's) output
    while the input is still being sent."""
    a, b = out.data_ptr(), inp.data_ptr()
    if out.numel() and inp.numel() and a < b + inp.numel() * inp.element_size() \
            and b < a + out.numel() * out.element_size():
        raise ValueError("all_to_all: out and inp overlap in memory (out is inp, or views of "
                         "one buffer); all_to_all cannot run in place, pass a separate out")


def splits_tensor(ctx, in_splits, out_splits, row: int, out_base: int = 0) -> torch.Tensor:
    """[in_offsets | in_counts | out_offsets | out_counts] in elements, int64, on the device;
    out offsets start at `out_base`. Uploaded once per distinct split (so that calls captured
    in a CUDA graph after a warm-up find it ready)."""
    cache = ctx.workspace("ccl.a2a_splits", lambda c: {})
    key = (tuple(in_splits), tuple(out_splits), row, out_base)
    if key not in cache:
        def offsets(counts, base=0):
            return [base + sum(counts[:i]) * row for i in range(len(counts))]
        values = (offsets(in_splits) + [c * row for c in in_splits]
                  + offsets(out_splits, out_base) + [c * row for c in out_splits])
        if len(cache) >= 256:
            cache.clear()
        cache[key] = torch.tensor(values, dtype=torch.int64, device=ctx.device)
    return cache[key]


def alignment(row: int) -> int:
    """Elements that every split offset is a multiple of (up to 16: vector accesses)."""
    return min(16, row & -row) if row else 1


def even_count(in_splits, out_splits, row: int):
    """Elements per peer if every rank-pair count of this rank is the same (the kernels
    then compute offsets instead of reading the split table), else None."""
    counts = set(in_splits) | set(out_splits)
    return counts.pop() * row if len(counts) == 1 else None


def programs_for(count: int, block: int, cap: int) -> int:
    """Host twin of `pair_programs`."""
    return max(1, min(cap, triton.cdiv(count, block)))


def grid_size(rank, world, sends, receives, stride, block, cap) -> int:
    """Programs a rank launches where program q serves distance k = q % (w-1) + 1 as its
    pair's program q // (w-1) (one_shot.py, lamport.py): enough for every pair's programs,
    sends (elements to rank+k, at most `stride` of them) and receives (from rank-k) alike;
    at least w-1."""
    lanes, grid = world - 1, world - 1
    for k in range(1, world):
        for count in (sends[(rank + k) % world], receives[(rank - k) % world]):
            grid = max(grid, (programs_for(min(count, stride), block, cap) - 1) * lanes + k)
    return grid


@triton.jit
def pair_programs(count, BLOCK: tl.constexpr, cap):
    """Programs that move a pair's `count` elements: one per block, at most `cap`, at
    least one (the pair's handshake)."""
    return tl.maximum(1, tl.minimum(cap, tl.cdiv(count, BLOCK)))


@triton.jit
def pair_flag(flags, phase: tl.constexpr, src, program):
    """Flag (phase, src, program) of ccl/device.py's layout (device._flag for any program)."""
    return flags + (phase * MAX_RANKS + src) * MAX_PROGRAMS + program


@triton.jit
def copy_rows(dst, src, count, first, step, rank, peer, heap_bases, BLOCK: tl.constexpr,
              ALIGN: tl.constexpr, REMOTE: tl.constexpr):
    """Blocks first, first + step, ... of `count` elements (whole rows: a multiple of
    ALIGN) from local `src` to `dst`: `peer`'s copy of it when REMOTE, else the local one.
    Callers hint the pointers' offsets with tl.multiple_of on the loaded value itself (or
    spell them x // ALIGN * ALIGN): a hint on a function argument, a call's result or an
    if's result is lost, and with it the 16-byte accesses."""
    count = count // ALIGN * ALIGN        # unchanged; tells the compiler, where a hint can't
    for blk in range(first, tl.cdiv(count, BLOCK), step):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < count
        x = tl.load(src + offs, mask=mask)
        if REMOTE:
            tdl.store(dst + offs, x, rank, peer, heap_bases, mask=mask)
        else:
            tl.store(dst + offs, x, mask=mask)


@triton.jit
def rows_to(inp, splits, n, peer, world_size, ALIGN: tl.constexpr, EVEN: tl.constexpr):
    """(elements, where they start in inp) of the rows this rank sends `peer`: from the
    split table (splits_tensor), or `n` each for even splits (EVEN: no table read)."""
    if EVEN:
        count = n
        src = inp + peer * n
    else:
        count = tl.load(splits + world_size + peer)
        src = inp + tl.multiple_of(tl.load(splits + peer), ALIGN)
    return count, src


@triton.jit
def rows_from(out, splits, n, src, world_size, ALIGN: tl.constexpr, EVEN: tl.constexpr):
    """(elements, where they go in out) of the rows this rank expects from `src` (rows_to's
    twin, from out_splits)."""
    if EVEN:
        count = n
        dst = out + src * n
    else:
        count = tl.load(splits + 3 * world_size + src)
        dst = out + tl.multiple_of(tl.load(splits + 2 * world_size + src), ALIGN)
    return count, dst


@triton.jit
def copy_own_rows(out, inp, splits, n, rank, world_size, heap_bases, BLOCK: tl.constexpr,
                  ALIGN: tl.constexpr, EVEN: tl.constexpr):
    """This rank's rows to itself, a local copy shared by every program of the launch (the
    host checked that in_splits and out_splits agree on them)."""
    count, src = rows_to(inp, splits, n, rank, world_size, ALIGN, EVEN)
    _, dst = rows_from(out, splits, n, rank, world_size, ALIGN, EVEN)
    copy_rows(dst, src, count, tl.program_id(0), tl.num_programs(0), rank, rank, heap_bases,
              BLOCK, ALIGN, False)
