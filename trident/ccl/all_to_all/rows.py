"""What the all_to_all algorithms share: the split table the kernels read, the check that
out and inp do not overlap, and the loop that moves a run of rows."""
import torch
import triton
import triton.language as tl

import trident.language as tdl


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


@triton.jit
def matched(count, expect, check):
    """`count` clipped to what the receiver expects; a mismatch sets `check` (raised as
    ValueError in debug mode)."""
    if count != expect:
        tl.atomic_xchg(check, 1)
    return tl.minimum(count, expect)


@triton.jit
def copy_rows(dst, src, count, rank, peer, heap_bases, BLOCK: tl.constexpr,
              ALIGN: tl.constexpr, REMOTE: tl.constexpr):
    """This program's blocks (program id, + number of programs, ...) of `count` elements
    (whole rows: a multiple of ALIGN) from local `src` to `dst`: `peer`'s copy of it when
    REMOTE, else the local one. Callers hint the pointers' offsets with tl.multiple_of
    on the loaded value itself: a hint on a function argument, a call's result or an
    if's result is lost, and with it the 16-byte accesses."""
    count = count // ALIGN * ALIGN        # unchanged; tells the compiler, where a hint can't
    for blk in range(tl.program_id(0), tl.cdiv(count, BLOCK), tl.num_programs(0)):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < count
        x = tl.load(src + offs, mask=mask)
        if REMOTE:
            tdl.store(dst + offs, x, rank, peer, heap_bases, mask=mask)
        else:
            tl.store(dst + offs, x, mask=mask)
