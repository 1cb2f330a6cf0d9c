"""Compile every kernel of trident for sm_90 (H100/H200) with the real Triton compiler --
no GPU needed -- at the constexpr combinations the host code launches on GPUs, and check
what the CPU emulation cannot: that each kernel compiles (PTX, then ptxas), and that its
copy loops keep 16-byte vector accesses (ld/st .v4) where their alignment allows.

Run in a process of its own, since the caller may be using the interpreter:
    python -m tests.compile.sm90 [--ptx-dir DIR] [SUBSTRING ...]
(only the kernels whose name matches; --ptx-dir writes each variant's PTX to
DIR/<module>.<kernel>.<variant>.ptx, to compare two trees' kernels). tests/compile/test_sm90.py
runs it.

kernels() lists (module, kernel, argument types, constexpr combinations). Argument names come
from the kernel itself: a kernel that gains an argument fails here until its entry gives
the type, and a constexpr combination must name every constexpr. Alignment is what Triton
assumes at a GPU launch when the value allows it: pointers 16-byte aligned, and the integer
arguments listed in `aligned` divisible by 16 (sizes and strides of the common, aligned
case). Each combination says which 16-byte accesses it must have (Variant.vectors, and
how many where a scalar branch sits beside a vector one: Variant.v4); one whose data is
not 16-byte aligned (all_to_all's odd rows) is only compiled.
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "0"          # before trident/triton pick their mode
os.environ["TRIDENT_BACKEND"] = "cuda"

import importlib  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
DIVISIBLE_BY_16 = [["tt.divisibility", 16]]

I32, I64, P8, P16, P32, P64 = "i32", "i64", "*i8", "*i16", "*i32", "*i64"
PF32, PBF16, PF16 = "*fp32", "*bf16", "*fp16"
# the arguments most kernels share
COMMON = dict(ctrl=P64, heap_bases=P64, trace_buf=P64, rank=I32, world_size=I32, world=I32,
              fp=I32)      # fp: the collectives' call fingerprint (ccl/device.py)


# The most shared memory one block may have on sm_90 (227 KB): a kernel that asks for more
# compiles, and fails only when a GPU loads it ("out of resource: shared memory").
MAX_SHARED = 232448


def compile_ptx(fn, signature: dict, constants: dict | None = None, aligned=(),
                num_warps: int = 4, num_stages: int = 3, shared: list | None = None) -> str:
    """PTX of `fn` for sm_90 (ptxas runs too: the cubin is built); `shared`, a list, gets
    the kernel's shared memory in bytes appended."""
    names = list(signature)
    attrs = {(names.index(a),): DIVISIBLE_BY_16 for a in aligned}
    if fn.is_gluon():           # a @gluon.jit kernel (trident.language.gluon.jit on GPUs)
        from triton.experimental.gluon._runtime import GluonASTSource
        src = GluonASTSource(fn, signature, constants or {}, attrs)
    else:
        src = ASTSource(fn, signature, constants or {}, attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    compiled = triton.compile(src, target=TARGET, options=options)
    if shared is not None:
        shared.append(compiled.metadata.shared)
    return compiled.asm["ptx"]


@dataclass
class Variant:
    """One constexpr combination of a launch, with its launch options."""
    constexprs: dict
    vectors: str = ""              # "all": every 8/16/32-bit global access is 16-byte;
                                   # "ld+st": 16-byte loads and stores (the kernel also has
                                   # scalar flags or a scalar branch); "": no requirement
                                   # (no copy loop, or data not 16-byte aligned)
    num_warps: int = 4
    num_stages: int = 3
    types: dict = field(default_factory=dict)    # argument types that differ per variant
    ptx_has: str | tuple = ""      # PTX instruction(s) the variant must contain (e.g.
                                   # setmaxnreg: warp specialisation took effect)
    v4: tuple = (0, 0)             # at least this many 16-byte loads and stores: a kernel
                                   # with a scalar branch beside its vector one ("ld+st")
                                   # says how many its vector branch has


# a kernel launched with programmatic dependent launch (ccl/lamport.py "PDL") waits for its
# predecessor first and lets its successor launch
PDL_PTX = ("griddepcontrol.wait", "griddepcontrol.launch_dependents")


def V(vectors="", num_warps=4, num_stages=3, types=None, ptx_has="", v4=(0, 0),
      **constexprs) -> Variant:
    return Variant(constexprs, vectors, num_warps, num_stages, types or {}, ptx_has, v4)


@dataclass
class Kernel:
    module: str
    name: str
    types: dict                    # non-constexpr arguments (COMMON fills the usual ones)
    variants: list
    aligned: tuple = ()            # integer arguments divisible by 16 in the aligned case

    @property
    def label(self) -> str:
        return f"{self.module}.{self.name}"


def _vector_accesses(ptx: str) -> tuple[int, int, int]:
    """(16-byte loads, 16-byte stores, scalar loads/stores of 8/16/32-bit words)."""
    loads = len(re.findall(r"\bld\.global(?:\.[\w:]+)*\.v4\.", ptx))
    stores = len(re.findall(r"\bst\.global(?:\.[\w:]+)*\.v4\.", ptx))
    scalar = len(re.findall(r"\b(?:ld|st)\.global(?:\.(?!v\d)[\w:]+)*\.[bsu](?:8|16|32)\b", ptx))
    return loads, stores, scalar


def compile_kernel(k: Kernel, ptx_dir: str | None = None) -> list[str]:
    """Compile every variant of `k`; returns one line per variant, raises on a failure.
    With `ptx_dir`, each variant's PTX is written there as <label>.<variant index>.ptx."""
    return [compile_variant(k, index, ptx_dir) for index in range(len(k.variants))]


def compile_variant(k: Kernel, index: int, ptx_dir: str | None = None) -> str:
    """Compile variant `index` of `k` and check it (see compile_kernel); its line."""
    fn = getattr(importlib.import_module(k.module), k.name)
    constexpr_names = [p.name for p in fn.params if p.is_constexpr]
    v = k.variants[index]
    types = {**COMMON, **k.types, **v.types}
    missing = [a for a in fn.arg_names if a not in constexpr_names and a not in types]
    if missing:
        raise AssertionError(f"{k.label}: no type for argument(s) {missing}: add them to "
                             f"its entry in tests/compile/sm90.py")
    if sorted(v.constexprs) != sorted(constexpr_names):
        raise AssertionError(f"{k.label}: constexprs {sorted(v.constexprs)} given, the "
                             f"kernel has {sorted(constexpr_names)}")
    sig = {a: "constexpr" if a in constexpr_names else types[a] for a in fn.arg_names}
    aligned = [a for a in fn.arg_names if sig[a].startswith("*") or a in k.aligned]
    t0 = time.perf_counter()
    shared = []
    try:
        ptx = compile_ptx(fn, sig, v.constexprs, aligned, v.num_warps, v.num_stages, shared)
    except Exception as exc:
        raise AssertionError(f"{k.label} {v.constexprs} does not compile for sm_90: "
                             f"{type(exc).__name__}: {exc}") from exc
    if ptx_dir is not None:
        with open(os.path.join(ptx_dir, f"{k.label}.{index}.ptx"), "w") as f:
            f.write(ptx)
    loads, stores, scalar = _vector_accesses(ptx)
    wanted = {"all": "ld+st", "ld+st": "ld+st", "st": "st"}.get(v.vectors, "")
    lost = [op for op, n in (("ld", loads), ("st", stores)) if op in wanted and not n]
    if lost or v.vectors == "all" and scalar:
        raise AssertionError(f"{k.label} {v.constexprs}: copy loops lost their 16-byte "
                             f"accesses ({loads} ld.v4, {stores} st.v4, {scalar} scalar)")
    if loads < v.v4[0] or stores < v.v4[1]:
        raise AssertionError(f"{k.label} {v.constexprs}: {loads} ld.v4 and {stores} st.v4, "
                             f"expected at least {v.v4[0]} and {v.v4[1]}: a copy loop "
                             f"lost its 16-byte accesses")
    for has in (v.ptx_has,) if isinstance(v.ptx_has, str) else v.ptx_has:
        if has and has not in ptx:
            raise AssertionError(f"{k.label} {v.constexprs}: no {has} in its PTX")
    if v.constexprs.get("PDL"):
        # launched early under PDL: no global access may come before the wait
        first = re.search(r"\b(?:ld|st|atom|red|cp\.async)\.[\w.:]*global", ptx)
        if first is None or ptx.find("griddepcontrol.wait") > first.start():
            raise AssertionError(f"{k.label} {v.constexprs}: a global access comes "
                                 f"before griddepcontrol.wait (PDL)")
    if shared[0] > MAX_SHARED:
        raise AssertionError(f"{k.label} {v.constexprs}: {shared[0]} bytes of shared "
                             f"memory, more than sm_90's {MAX_SHARED}: it would not load")
    return (f"{k.label} {v.types or ''}{v.constexprs} warps={v.num_warps}: "
            f"{loads} ld.v4, {stores} st.v4, {shared[0]} B shared "
            f"({time.perf_counter() - t0:.1f} s)")


# ---------------------------------------------------------------------------- the kernels
def _ccl() -> list[Kernel]:
    """Collectives at trident/ccl/common.py's GPU launch sizes: 16 KiB per program step
    (BLOCK = 16384 // element size), 8 warps. Data movement runs on int32 words
    (common.as_words); reductions on the tensor's own dtype."""
    from trident.ccl.common import GPU_BLOCK_BYTES, GPU_NUM_WARPS, REDUCE_OPS
    w = GPU_NUM_WARPS
    word_block = GPU_BLOCK_BYTES // 4
    from trident.ccl.all_gather.pull import GPU_BLOCK_BYTES as PULL_AG_BLOCK_BYTES
    pull_ag_block = PULL_AG_BLOCK_BYTES // 4
    from trident.ccl.reduce_scatter.pull import GPU_IN_FLIGHT_BYTES as PULL_IN_FLIGHT_BYTES
    reduce_types = {"*bf16": 2, "*fp16": 2, "*fp32": 4}
    # integers reduce in their own type (device.py: to_acc): int32 keeps the 16-byte
    # accesses; int64's are ld/st.v2.b64 and the bytes' .v4.b32 pairs, so those and the
    # 8-bit ones are only compiled. Fewer ops than the floats: the compile is what differs
    int_reductions = [("*i32", 4, 0, True), ("*i32", 4, 1, True), ("*i64", 8, 0, False),
                      ("*i8", 1, 1, False), ("*u8", 1, 2, False)]

    def reductions(*data_args, word=False, vectors="all", **more):
        out = []
        cases = [(dtype, size, op, True) for dtype, size in reduce_types.items()
                 for op in REDUCE_OPS.values()] + int_reductions
        for dtype, size, op, vector in cases:
            extra = {"WORD": size} if word else {}
            more_ = more if vector else {k: v for k, v in more.items() if k != "v4"}
            out.append(V(vectors if vector else "", w, types=dict.fromkeys(data_args, dtype),
                         OP=op, BLOCK=GPU_BLOCK_BYTES // size,
                         TRACE=op == 0 and size == 2, **extra, **more_))
        return out

    def pulled_worlds(types, stores):
        """The pull reductions (WORLD a constexpr, 4 above) at 2 and 8 ranks, bf16 sum, at
        their block (reduce_scatter/pull.py: reduce_block, smaller at 8 ranks): one
        16-byte load per rank per 8 elements a thread has, as many stores -- per rank
        if the result goes to every rank (two-shot)."""
        out = []
        for world in (2, 8):
            block = min(GPU_BLOCK_BYTES, PULL_IN_FLIGHT_BYTES // world) // 2
            vecs = block // (w * 32 * 8)
            out.append(V("ld+st", w, types=types,
                         v4=(vecs * world, vecs * world if stores else vecs), OP=0,
                         BLOCK=block, TRACE=False, WORD=2, WORLD=world))
        return out

    flags = dict(flags=P64, sync=P64)
    push = dict(scratch=P32, n=I32, stride=I32, half=I32, **flags)
    pull = dict(offsets=P64, my_offset=I64, n=I32, **flags)
    a2a = dict(splits=P64, **flags)
    copies = [V("all", w, BLOCK=word_block, TRACE=t) for t in (False, True)]
    return [
        Kernel("trident.ccl.barrier", "_barrier_kernel", {}, [V()]),
        Kernel("trident.ccl.all_gather.push", "_push_kernel", dict(out=P32, inp=P32, **push),
               copies, aligned=("n", "stride", "half")),
        # Gluon (issue 22): one 16-byte load and WORLD 16-byte stores per vector a thread
        # holds (BLOCK // (warps * 32 * 4) of them), then the copy out of the slots. int16
        # words (bf16/fp16 data: common.word_type) keep them too.
        Kernel("trident.ccl.all_gather.gluon", "_gluon_kernel", dict(out=P32, inp=P32, **push),
               [V("all", nw, v4=(vecs * world, vecs * (2 * world - 1)), BLOCK=blk, VEC=4,
                  WARPS=nw, WORLD=world, TRACE=t)
                for world, t, blk, nw in ((4, False, word_block, w), (4, True, word_block, w),
                                          (2, False, word_block, w), (8, False, word_block, w),
                                          (4, False, word_block // 4, 2))
                for vecs in [blk // (nw * 32 * 4)]]
               + [V("all", w, v4=(16, 28), types=dict(out=P16, inp=P16, scratch=P16),
                    BLOCK=word_block * 2, VEC=8, WARPS=w, WORLD=4, TRACE=False)],
               aligned=("n", "stride", "half")),
        Kernel("trident.ccl.all_gather.pull", "_pull_kernel", dict(out=P32, inp=P32, **pull),
               [V("ld+st", w, v4=(8, 16), BLOCK=pull_ag_block, WORD=4, WORLD=world, TRACE=t)
                for world, t in ((4, False), (4, True), (2, False), (8, False))]
               + [V("ld+st", w, v4=(8, 16), types=dict(out=P16, inp=P16),
                    BLOCK=2 * pull_ag_block, WORD=2, WORLD=4, TRACE=False)],  # bf16/fp16
               aligned=("n", "my_offset")),
        # knobs (bench/lab/sweep.py): pull order="block" (every rank's load of a block in
        # flight at once), push_direct (stores into every rank's output), at the warps
        # and blocks the sweep times
        Kernel("trident.ccl.all_gather.pull", "_pull_block_kernel",
               dict(out=P32, inp=P32, **pull),
               [V("ld+st", nw, v4=(vecs * world, vecs * world), BLOCK=blk, WORD=4,
                  WORLD=world, TRACE=t)
                for world, t, blk, nw in ((4, False, pull_ag_block // 2, w),
                                          (4, True, pull_ag_block // 2, w),
                                          (2, False, pull_ag_block // 2, w),
                                          (8, False, pull_ag_block // 4, w))
                for vecs in [blk // (nw * 32 * 4)]],
               aligned=("n", "my_offset")),
        Kernel("trident.ccl.all_gather.push_direct", "_push_direct_kernel",
               dict(out=P32, inp=P32, **pull),
               [V("ld+st", nw, v4=(vecs, vecs * world), BLOCK=blk, WORD=4, WORLD=world,
                  TRACE=t)
                for world, t, blk, nw in ((4, False, word_block, w), (4, True, word_block, w),
                                          (4, False, 2 * word_block, w),
                                          (4, False, word_block, 4), (2, False, word_block, w),
                                          (8, False, word_block, w))
                for vecs in [blk // (nw * 32 * 4)]]
               + [V("ld+st", w, v4=(4, 16), types=dict(out=P16, inp=P16),
                    BLOCK=2 * word_block, WORD=2, WORLD=4, TRACE=False)],
               aligned=("n", "my_offset")),
        Kernel("trident.ccl.broadcast.push", "_push_kernel", dict(t=P32, src=I32, **push),
               copies, aligned=("n", "stride", "half")),
        # relay: a vector branch and a scalar one (peers' copies at any heap offset).
        # int16 words (bf16/fp16 data) keep 16-byte accesses; int8 ones come from an odd
        # size: only compiled.
        Kernel("trident.ccl.broadcast.relay", "_relay_kernel",
               dict(t=P32, src=I32, chunk_flags=P64, chunk=I32, **pull),
               [V("ld+st", w, v4=(16, 8), BLOCK=word_block, WORD=4, TRACE=t)
                for t in (False, True)]
               + [V("ld+st", w, v4=(16, 8), types=dict(t=P16), BLOCK=GPU_BLOCK_BYTES // 2,
                    WORD=2, TRACE=False),
                  V("", w, types=dict(t=P8), BLOCK=GPU_BLOCK_BYTES, WORD=1, TRACE=False)],
               aligned=("n", "my_offset", "chunk")),
        Kernel("trident.ccl.reduce_scatter.push", "_push_kernel", dict(out=P32, inp=P32, **push),
               reductions("out", "inp", "scratch"), aligned=("n", "stride", "half")),
        Kernel("trident.ccl.reduce_scatter.pull", "_pull_kernel", dict(out=P32, inp=P32, **pull),
               reductions("out", "inp", word=True, vectors="ld+st", WORLD=4, v4=(16, 8))
               + pulled_worlds(dict(out=PBF16, inp=PBF16), stores=False),
               aligned=("n", "my_offset")),
        Kernel("trident.ccl.all_reduce.one_shot", "_one_shot_kernel", dict(t=P32, **push),
               reductions("t", "scratch"), aligned=("n", "stride", "half")),
        # Lamport (ccl/lamport.py): the data words are the ready flags; 4 warps, 2 KiB a
        # program per step (ccl/lamport.py: WARPS, BLOCK_BYTES)
        Kernel("trident.ccl.all_reduce.lamport", "_lamport_kernel",
               dict(t=PBF16, data=P16, heads=P64, lsync=P64, fsync=P64, n=I32, slot=I32),
               [V("ld+st", 4, types=types, WORLD=world, OP=op, BLOCK=block, TRACE=trace,
                  PDL=not trace, ptx_has=PDL_PTX if not trace else "")
                for types, block in ((dict(), 1024), (dict(t=PF32, data=P32), 512))
                for world, op, trace in ((2, 0, False), (4, 0, False), (8, 1, False),
                                         (4, 0, True))],
               aligned=("n", "slot")),
        Kernel("trident.ccl.reduce_scatter.lamport", "_lamport_kernel",
               dict(out=PBF16, inp=PBF16, data=P16, heads=P64, lsync=P64, fsync=P64, n=I32,
                    slot=I32),
               [V("ld+st", 4, types=types, WORLD=world, OP=op, BLOCK=block, TRACE=trace,
                  PDL=not trace, ptx_has=PDL_PTX if not trace else "")
                for types, block in ((dict(), 1024), (dict(out=PF32, inp=PF32, data=P32), 512))
                for world, op, trace in ((2, 0, False), (4, 0, False), (8, 1, False),
                                         (4, 0, True))],
               aligned=("n", "slot")),
        # LL units (ccl/lamport.py): 8-byte [payload, flag] words, two a thread, so that a
        # thread's sends and polls are 16-byte (v2.b64) accesses; any word width
        Kernel("trident.ccl.all_gather.lamport", "_lamport_kernel",
               dict(out=P32, inp=P32, count=I32, data=P64, heads=P64, lsync=P64, fsync=P64,
                    n=I32, slot=I32),
               [V("", 4, types=types, WORLD=world, WORD=word, BLOCK=256, TRACE=trace,
                  PDL=not trace, ptx_has=("st.global.v2.b64", "ld.volatile.global.v2.b64")
                  + (() if trace else PDL_PTX))
                for types, word in ((dict(), 4), (dict(out=P16, inp=P16), 2),
                                    (dict(out=P8, inp=P8), 1))
                for world, trace in ((2, False), (4, False), (8, False), (4, True))],
               aligned=("count", "n", "slot")),
        # broadcast's and all_to_all's Lamport algorithms: the same LL units
        Kernel("trident.ccl.broadcast.lamport", "_lamport_kernel",
               dict(t=P32, count=I32, src=I32, data=P64, heads=P64, lsync=P64, fsync=P64,
                    n=I32, slot=I32),
               [V("", 4, types=types, WORLD=world, WORD=word, BLOCK=256, TRACE=trace,
                  PDL=not trace, ptx_has=("st.global.v2.b64", "ld.volatile.global.v2.b64")
                  + (() if trace else PDL_PTX))
                for types, word in ((dict(), 4), (dict(t=P16), 2), (dict(t=P8), 1))
                for world, trace in ((2, False), (4, False), (8, False), (4, True))],
               aligned=("count", "n", "slot")),
        # all_to_all: even splits (no table) and uneven ones, rows of whole 16 words
        # (ALIGN 16) and odd rows (ALIGN 1: bf16 rows of 3, as int16 words)
        Kernel("trident.ccl.all_to_all.lamport", "_lamport_kernel",
               dict(out=P32, inp=P32, splits=P64, cap=I32, data=P64, heads=P64, lsync=P64,
                    fsync=P64, n=I32, slot=I32),
               [V("", 4, types=types, WORLD=world, WORD=word, ALIGN=align, EVEN=even,
                  BLOCK=256, TRACE=trace, PDL=not trace,
                  ptx_has=("st.global.v2.b64", "ld.volatile.global.v2.b64")
                  + (() if trace else PDL_PTX))
                for types, word, align in ((dict(), 4, 16), (dict(out=P16, inp=P16), 2, 1),
                                           (dict(out=P8, inp=P8), 1, 16))
                for world, even, trace in ((2, True, False), (4, False, False),
                                           (8, True, False), (8, False, False),
                                           (4, True, True))],
               aligned=("n", "slot")),
        Kernel("trident.ccl.all_reduce.two_shot", "_two_shot_kernel",
               dict(t=P32, seg=I32, **pull),
               reductions("t", word=True, vectors="ld+st", WORLD=4, v4=(16, 16))
               + pulled_worlds(dict(t=PBF16), stores=True),
               aligned=("n", "seg", "my_offset")),
        # fused all-reduce + residual + RMSNorm (add_rmsnorm.py: launch_size): a row in
        # chunks of up to 4096 elements, 8 warps from 2048; hidden 16-aligned (Llama sizes)
        Kernel("trident.ccl.add_rmsnorm", "_add_rmsnorm_kernel",
               dict(x=PBF16, residual=PBF16, weight=PBF16, out=PBF16, scratch=PBF16, rows=I32,
                    hidden=I32, stride=I32, half=I32, eps="fp32", **flags),
               [V("all", warps, types=types, BLOCK=block, TRACE=trace)
                for types, block, warps, trace in (
                    ({}, 4096, 8, False), ({}, 4096, 8, True), ({}, 1024, 4, False),
                    (dict(x=PF16, residual=PF16, out=PF16, scratch=PF16, weight=PF32),
                     4096, 8, False))],
               aligned=("hidden", "stride", "half")),
        # its Lamport algorithm (add_rmsnorm.py: _lamport_kernel): the same launch sizes,
        # the exchange by ccl/lamport.py (data words of x's width, int64 heads)
        Kernel("trident.ccl.add_rmsnorm", "_lamport_kernel",
               dict(x=PBF16, residual=PBF16, weight=PBF16, out=PBF16, data=P16, heads=P64,
                    lsync=P64, fsync=P64, rows=I32, hidden=I32, slot=I32, eps="fp32"),
               [V("all", warps, types=types, WORLD=world, BLOCK=block, TRACE=trace,
                  PDL=not trace, ptx_has=PDL_PTX if not trace else "")
                for types, block, warps, world, trace in (
                    ({}, 4096, 8, 2, False), ({}, 4096, 8, 4, False), ({}, 4096, 8, 8, False),
                    ({}, 4096, 8, 4, True), ({}, 1024, 4, 4, False),
                    (dict(x=PF32, residual=PF32, out=PF32, data=P32, weight=PF32),
                     4096, 8, 4, False),
                    (dict(x=PF16, residual=PF16, out=PF16, data=P16, weight=PF32),
                     4096, 8, 8, False))],
               aligned=("hidden", "slot")),
        # ALIGN = the rows' alignment in words (all_to_all/rows.py: alignment): 16 keeps
        # 16-byte accesses; odd rows (ALIGN 1, or int16/int8 words) cannot have them.
        Kernel("trident.ccl.all_to_all.push", "_push_kernel",
               dict(anchor=P32, inp=P32, meta=P64, **a2a),
               [V("ld+st", w, BLOCK=word_block, ALIGN=16, TRACE=False),
                V("ld+st", w, BLOCK=word_block, ALIGN=16, TRACE=True),
                V("", w, BLOCK=word_block, ALIGN=1, TRACE=False),
                V("", w, types=dict(anchor=P8, inp=P8), BLOCK=GPU_BLOCK_BYTES, ALIGN=1,
                  TRACE=False)]),
        # EVEN: every pair count of the rank the same (offsets computed, no split table)
        Kernel("trident.ccl.all_to_all.one_shot", "_one_shot_kernel",
               dict(out=P32, inp=P32, slots=P32, counts=P64, n=I32, half=I32, counts_half=I32,
                    stride=I32, cap=I32, **a2a),
               [V("all", w, BLOCK=word_block, ALIGN=16, EVEN=even, TRACE=t)
                for even in (True, False) for t in (False, True)]
               + [V("", w, BLOCK=word_block, ALIGN=1, EVEN=even, TRACE=False)
                  for even in (True, False)]
               + [V("", w, types=dict(out=P16, inp=P16, slots=P16), BLOCK=GPU_BLOCK_BYTES // 2,
                    ALIGN=1, EVEN=even, TRACE=False) for even in (True, False)],
               aligned=("half", "counts_half", "stride", "n")),
    ]


# trident/ops/_common.py: gemm_config's three choices on Hopper (the "classic" GEMM core)
GEMM_CONFIGS = [dict(BM=128, BN=256, BK=64, num_warps=8, num_stages=3),
                dict(BM=128, BN=128, BK=64, num_warps=8, num_stages=4),
                dict(BM=64, BN=128, BK=64, num_warps=4, num_stages=4)]


def _ops() -> list[Kernel]:
    """The fused GEMM + communication kernels. Classic core (TRIDENT_GEMM=classic): each
    gemm_config choice, one tile per program, pointer loads. TMA core (TRIDENT_GEMM=tma):
    every config gemm_table.json uses, swap-AB and split-K ones as the fused ops run them
    (trident/ops/fused_tile.py: the op's tile is the config's transposed under swap-AB;
    SPLIT where the config has SPLIT_K), persistent programs, TMA loads of A/W (the PTX
    must hold cp.async.bulk.tensor, and wgmma), the persistent pointer path once per
    kernel (tensors TMA cannot address), and a swap-AB split-K config on the classic core
    and on the pointer path. bf16 and fp16, with and without bias (fp32 bias in one), K a
    multiple of BK or not. The pushers' and the partials' copies keep 16-byte accesses."""
    from trident.runtime.errors import OP_CODES
    from trident.ops import gemm
    from trident.ops.fused_tile import tile_shape
    ints = ("M", "N", "K", "m_local", "stride_am", "stride_wn", "stride_om")
    ag, rs = [], []
    split_k = dict(k_partials=PF32, k_counters=P32, split_k=I32)

    def add(i, cfg, persistent, tma, all_reduces=(False, True)):
        cfg = gemm.resolve(cfg)
        opts = dict(num_warps=cfg.pop("num_warps"), num_stages=cfg.pop("num_stages"))
        cfg.pop("WARP_SPECIALIZE", None)
        cfg.pop("STREAM_K", None)           # fused_tile runs a stream-K config's tiles plainly
        split = cfg.pop("SPLIT_K") > 1
        swap = cfg["SWAP_AB"]
        cfg["BM"], cfg["BN"] = tile_shape(cfg)      # the op's tile of out
        cfg.update(SWAP_AB=swap, SPLIT=split)
        group_m = cfg.pop("GROUP_M", 8)
        dt = PBF16 if i != 1 else PF16
        types = dict(a=dt, w=dt, out=dt, bias=PF32 if i == 2 else dt)
        has = ("cp.async.bulk.tensor", "wgmma.mma_async") if tma else ""
        core = dict(PERSISTENT=persistent, TMA=tma)
        ag.append(V("ld+st", **opts, types=dict(types, gathered=dt), ptx_has=has, **cfg,
                    NUM_PUSHERS=16, GROUP_M=group_m, COPY_M=32, COPY_K=256,
                    EVEN_K=i != 2, ALIGNED=i != 1, HAS_BIAS=i != 0, TRACE=i == 1, **core))
        for all_reduce in all_reduces:
            op = OP_CODES["matmul_all_reduce" if all_reduce else "matmul_reduce_scatter"]
            rs.append(V("ld+st", **opts, types=dict(types, partials=dt, result=dt),
                        ptx_has=has, **cfg, GROUP_M=group_m if persistent else 1,
                        EVEN_K=i != 2, HAS_BIAS=i != 0, ALL_REDUCE=all_reduce, OP=op,
                        TRACE=i == 1, **core))

    for i, cfg in enumerate(GEMM_CONFIGS):
        add(i, cfg, False, False)
    for i, name in enumerate(_fused_table_configs()):
        add(i % 3, gemm.KNOWN[name], True, True, (i % 2 == 1,))
    add(2, gemm.CANDIDATES["64x128x64_s4_w4"], True, False)
    add(0, gemm.CANDIDATES["128x256x64_s3_w8"], True, True, (True,))
    swab = gemm.CANDIDATES["swab128x64x64_s6_w4_sk8"]
    add(1, swab, False, False)                   # classic core: one program per unit
    add(2, gemm.CANDIDATES["swab128x32x128_s4_w4_sk8"], True, False)
    add(0, dict(swab, SPLIT_K=1), True, True, (True,))      # swap-AB alone
    # the epilogue schedule (trident/ops/epilogue.py): row-parallel kernels with the
    # decode configs the GEMM table gives small M (swap-AB, TMA or pointers) and the
    # classic tiles; the gathered-rows kernel at its GPU tiles (BM 16..64), split or not
    epi_rs, epi_ag = [], []
    # (config, TMA, the column extent after epilogue's shrinking, or None: the config's)
    for i, (cfg, tma, cols) in enumerate(((swab, True, None), (swab, False, None),
                                          (GEMM_CONFIGS[-1], False, None), (swab, True, 32),
                                          (swab, False, 64))):
        cfg = gemm.resolve(cfg)
        opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        bm, bn = tile_shape(cfg)
        bn = cols or bn
        i %= 3
        dt = PBF16 if i != 1 else PF16
        for all_reduce in (False, True):
            op = OP_CODES["matmul_all_reduce" if all_reduce else "matmul_reduce_scatter"]
            epi_rs.append(V(**opts, types=dict(a=dt, w=dt, out=dt, scratch=dt,
                                               bias=PF32 if i == 2 else dt),
                            BM=bm, BN=bn, BK=cfg["BK"], EVEN_K=i != 2, TMA=tma,
                            SWAP_AB=cfg["SWAP_AB"], HAS_BIAS=i != 0, OP=op, TRACE=i == 1))
    for i, bm in enumerate((16, 32, 64)):
        dt = PBF16 if i != 1 else PF16
        epi_ag.append(V(num_warps=4, num_stages=3, types=dict(a=dt, w=dt, out=dt, bias=dt),
                        BM=bm, BN=128, BK=64, EVEN_K=i != 2, HAS_BIAS=i != 0, SPLIT=i != 1,
                        OP=OP_CODES["all_gather_matmul"], TRACE=i == 1))
    epi_ints = dict.fromkeys(("M", "N", "K", "m_local", "owner_rows", "stride_am",
                              "stride_wn", "stride_om", "half", "slot", "num_units",
                              "num_tiles"), I32)
    return [
        Kernel("trident.ops.epilogue", "_push_reduce_kernel",
               dict(flags=P64, sync=P64, **epi_ints), epi_rs,
               aligned=("N", "K", "stride_am", "stride_wn", "stride_om", "half", "slot")),
        # its Lamport exchange (epilogue_lamport.py): the same tiles, data words as flags;
        # NORM (matmul_all_reduce_add_rmsnorm's one kernel): those tiles of all_reduce,
        # then the residual add, the row blocks' counters and the rows' norm. At world 8
        # too (its per-peer code unrolled 8 times): 3-8 s a variant on 2 cores now
        Kernel("trident.ops.epilogue_lamport", "_push_reduce_lamport_kernel",
               dict(data=P16, heads=P64, lsync=P64, fsync=P64, counters=P64, eps="fp32",
                    **epi_ints),
               [V("", v.num_warps, v.num_stages, types={k: t for k, t in v.types.items()
                                                    if k != "scratch"} | dict(
                       residual=v.types["a"], res_out=v.types["a"], norm_weight=v.types["a"]),
                  WORLD=world, NORM=False, NORM_BLOCK=16, PDL=j != 2,
                  ptx_has=PDL_PTX if j != 2 else "", **v.constexprs)
                for j, (v, world) in enumerate(zip(epi_rs[:2] + epi_rs[4:6] + epi_rs[:1],
                                                   (2, 4, 4, 2, 8)))]
               + [V("", v.num_warps, v.num_stages,
                    types={k: t for k, t in v.types.items() if k != "scratch"} | dict(
                        residual=v.types["out"], res_out=v.types["out"], counters=P32,
                        norm_weight=PF32 if i == 2 else v.types["out"]),
                    WORLD=world, NORM=True, NORM_BLOCK=block, PDL=True, ptx_has=PDL_PTX,
                    **dict(v.constexprs, OP=OP_CODES["matmul_all_reduce_add_rmsnorm"]))
                  for i, (v, world, block) in enumerate(zip(epi_rs[1::2] + epi_rs[1:2],
                                                            (2, 4, 4, 2, 4, 8),
                                                            (2048, 2048, 1024, 2048, 256,
                                                             2048)))],
               aligned=("N", "K", "stride_am", "stride_wn", "stride_om", "slot")),
        Kernel("trident.ops.epilogue", "_pull_gemm_kernel",
               dict(offsets=P64, my_offset=I64, flags=P64, sync=P64, **split_k, **epi_ints),
               epi_ag, aligned=("K", "stride_wn", "stride_om")),
        Kernel("trident.ops.all_gather_matmul", "_all_gather_matmul_kernel",
               dict(sync=P32, **split_k, **dict.fromkeys(ints, I32)), ag, aligned=ints),
        Kernel("trident.ops.matmul_reduce_scatter", "_matmul_reduce_kernel",
               dict(sync=P32, num_tiles=I32, slots=I32, num_gemm=I32, **split_k,
                    **dict.fromkeys(ints, I32)), rs,
               aligned=ints),
    ]


def _fused_table_configs() -> list[str]:
    """The candidates the fused kernels take from gemm_table.json (fused_tile reads
    config_for with split_k: each class's config, swap-AB and split-K included)."""
    from trident.ops import gemm_tables
    from trident.ops import gemm
    used = set()
    for table in gemm_tables.read()[1].values():
        for entry in table.classes.values():
            name = entry["config"]
            if isinstance(name, str):       # a Gluon config: the fused kernels run its twin
                used.add(gemm.KNOWN[name].get("TWIN", name) if name in gemm.KNOWN else name)
    return sorted(used)


def _gemm() -> list[Kernel]:
    """trident/ops/gemm.py's persistent GEMM: every candidate config (the deep ones too) on
    the TMA path with host-side descriptors (bf16; split-K ones run SPLIT; swap-AB ones
    SWAP_AB; stream-K ones STREAM_K), with in-kernel descriptors at the large, a
    warp-specialised (must show setmaxnreg), a split-K and a swap-AB config, fp16 and an
    fp32 bias once, and the pointer path (unaligned tensors) at the large and the small
    tile, split-K, swap-AB and stream-K once. Every variant's PTX must hold wgmma (the
    tensor cores of sm_90: a swap-AB tile of 16-64 columns too) and, on the TMA path, TMA
    copies; shared memory under 227 KB."""
    from trident.ops import gemm, gemm_configs
    ints = ("M", "N", "K", "stride_am", "stride_wn", "stride_om")
    bf16 = dict(a=PBF16, w=PBF16, bias=PBF16, out=PBF16)
    variants = []

    def add(cfg, tma, types=bf16, even_k=True, bias=False, host=True):
        types = dict(types)
        if tma and host:                      # TensorDescriptor arguments
            dt = types["a"].lstrip("*")
            types.update(a=f"tensordesc<{dt}[{cfg['BM']},{cfg['BK']}]>",
                         w=f"tensordesc<{dt}[{cfg['BN']},{cfg['BK']}]>")
        split = cfg.get("SPLIT_K", 1) > 1
        has = ("setmaxnreg",) if cfg["WARP_SPECIALIZE"] else ("wgmma.mma_async",) + \
            (("cp.async.bulk.tensor",) if tma else ())
        variants.append(V(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                          types=types, ptx_has=has,
                          NUM_PROGRAMS=132, BM=cfg["BM"], BN=cfg["BN"], BK=cfg["BK"],
                          GROUP_M=cfg["GROUP_M"], TMA=tma, HOST_DESC=tma and host,
                          SPLIT=split, WARP_SPECIALIZE=cfg["WARP_SPECIALIZE"] and tma and
                          not split, EVEN_K=even_k, HAS_BIAS=bias,
                          SWAP_AB=cfg.get("SWAP_AB", False),
                          STREAM_K=cfg.get("STREAM_K", False) and not split))

    for cfg in {**gemm.CANDIDATES, **gemm_configs.DEEP_CANDIDATES}.values():
        add(cfg, True)
    big, small = gemm.CANDIDATES["128x256x64_s3_w8"], gemm.CANDIDATES["64x128x64_s4_w4"]
    swab = gemm.CANDIDATES["swab128x64x64_s6_w4_sk8"]
    add(big, True, host=False)
    # warp-specialised (no candidate is: trident/ops/gemm.py), in-kernel descriptors only
    add(dict(gemm.CANDIDATES["128x128x64_s4_w8"], num_warps=4, WARP_SPECIALIZE=True), True,
        host=False)
    add(gemm.CANDIDATES["128x128x64_s4_w8_sk8"], True, bias=True, host=False)
    add(big, True, dict(a=PF16, w=PF16, bias=PF32, out=PF16), bias=True)
    add(big, False, even_k=False, bias=True)
    add(small, False, dict(a=PF16, w=PF16, bias=PF16, out=PF16), even_k=False)
    add(gemm.CANDIDATES["64x128x64_s4_w4_sk8"], False, even_k=False, bias=True)
    # swap-AB: bias along the tile's rows, in-kernel descriptors (no output descriptor),
    # one slice, fp16 with an fp32 bias, and the pointer path
    add(swab, True, bias=True, host=False)
    add(dict(swab, SPLIT_K=1), True, dict(a=PF16, w=PF16, bias=PF32, out=PF16), bias=True)
    add(gemm.CANDIDATES["swab128x32x128_s4_w4_sk8"], False, even_k=False, bias=True)
    # stream-K: in-kernel descriptors (an output descriptor) with a bias, and the pointer path
    add(gemm.KNOWN["128x128x64_s4_w8_streamk"], True, bias=True, host=False)
    add(gemm.KNOWN["128x64x64_s6_w4_streamk"], False, even_k=False, bias=True)
    return [Kernel("trident.ops.gemm", "_gemm_kernel",
                   dict(partials=PF32, counters=P32, split_k=I32, **dict.fromkeys(ints, I32)),
                   variants)]


def _pipelined() -> list[Kernel]:
    """trident/ops/pipelined.py: the copy, wait, finish, reduce and gather kernels of the
    pipelined schedule (bf16 and fp16, bias on and off, the all-reduce's variant), at the
    GPU block (8 x 256): the copies and the reduction keep 16-byte accesses."""
    from trident.runtime.errors import OP_CODES
    op = OP_CODES["matmul_all_reduce"]
    block = dict(BR=8, BC=256)
    flags = dict(sync=P32, rows=I32, cols=I32, peer=I32, stride_src=I32,
                 stride_om=I32, slot=I32, row0=I32, M=I32, chunk=I32)
    aligned = ("cols", "stride_src", "stride_om", "slot")
    return [
        Kernel("trident.ops.pipelined", "_begin_kernel", dict(sync=P32), [V()]),
        Kernel("trident.ops.pipelined", "_push_kernel", dict(src=PBF16, dst=PBF16, **flags),
               [V("ld+st", OP=op, **block),
                V("ld+st", OP=op, types=dict(src=PF16, dst=PF16), **block)], aligned=aligned),
        Kernel("trident.ops.pipelined", "_wait_kernel", dict(src=I32, **flags), [V(OP=op)]),
        Kernel("trident.ops.pipelined", "_finish_kernel", dict(out=PBF16, **flags),
               [V(**block)], aligned=aligned),
        Kernel("trident.ops.pipelined", "_reduce_kernel",
               dict(recv=PBF16, out=PBF16, result=PBF16, bias=PBF16, **flags),
               [V("ld+st", HAS_BIAS=False, ALL_REDUCE=False, OP=op, **block),
                V("ld+st", HAS_BIAS=True, ALL_REDUCE=True, OP=op, **block,
                  types=dict(bias=PF32))], aligned=aligned),
        Kernel("trident.ops.pipelined", "_gather_kernel",
               dict(result=PBF16, out=PBF16, **flags), [V("ld+st", OP=op, **block)],
               aligned=aligned),
    ]


def _pdl(trace: bool) -> dict:
    """An MoE variant's TRACE, and PDL as sm_90+ launches them (moe/plans.py `PDL`): its
    instructions, and no global access before the wait (compile_variant), traced or not
    (the trace's first store comes after the wait too). The plain launch (the knob off)
    is the same code without the two instructions."""
    return dict(TRACE=trace, PDL=True, ptx_has=PDL_PTX)


def _moe() -> list[Kernel]:
    """Dispatch and combine, DeepSeek-V3's shape on 8 ranks (H 7168, top-8, 256 experts).
    PART=BOTH (the fused launch) holds both halves' code; the split launches (SEND, RECV)
    are compiled too, since they are launched on their own."""
    from trident.moe import buffers as B
    from trident.moe.plans import BLOCK_T
    H, K, world, experts = 7168, 8, 8, 256
    shape = dict(H=H, K=K, KP=triton.next_power_of_2(K), WP=triton.next_power_of_2(world),
                 BLOCK_H=B.block_h(H))
    block_l = min(1024, triton.next_power_of_2(experts // world))
    buffers = dict(flags=P64, fps=P64, slots=P64, state=P64, send_slot=P32, token_rows=P32,
                   recv_count=P32, max_tokens=I32, cap=I32, send_programs=I32,
                   peer_programs=I32)
    # the low-latency kernels' signal slots at 128 tokens per rank: their row (NS) and
    # the widest look at them (NP: dispatch's 128 senders, combine's 2 x 132 programs)
    M = 128
    dshape = dict(shape, NS=B.slot_count(world, M), NP=M)
    cshape = dict(shape, NS=B.slot_count(world, M), NP=512)
    dispatch = dict(x=PBF16, stride_x=I32, topk_idx=P64, stride_it=I32, stride_ik=I32,
                    topk_weights=PF32, stride_wt=I32, stride_wk=I32, num_tokens=I32,
                    tokens=PBF16, meta=P32, dweights=PF32,
                    expert_counter=P32, expert_x=PBF16, expert_x_scale=P32,
                    expert_num_tokens=P32,
                    experts_per_rank=I32, num_experts=I32, check_ids=I32, **buffers)
    combine = dict(expert_y=PBF16, stride_ye=I32, stride_yr=I32, topk_weights=PF32,
                   stride_wt=I32, stride_wk=I32, out=PBF16, num_tokens=I32, weights=PF32,
                   partial=PBF16, num_weight_programs=I32, **buffers)
    return [
        Kernel("trident.moe.dispatch", "dispatch_kernel", dispatch,
               [V("ld+st", **dshape, PART=B.BOTH.value, HAS_WEIGHTS=True, BLOCK_L=block_l,
                  FP8=False, **_pdl(False)),
                V("ld+st", types=dict(topk_idx=P32), **dshape, PART=B.BOTH.value,
                  HAS_WEIGHTS=False, BLOCK_L=block_l, FP8=False, **_pdl(True)),
                V("ld+st", **dshape, PART=B.SEND.value, HAS_WEIGHTS=True, BLOCK_L=block_l,
                  FP8=False, **_pdl(False)),
                V("ld+st", **dshape, PART=B.RECV.value, HAS_WEIGHTS=False, BLOCK_L=block_l,
                  FP8=False, **_pdl(False))]
               # fp8 (dispatch(..., fp8=True)): the receive buffer and expert_x as int32
               # words, quantised in the send half, words copied in the receive half
               + [V(vec, types=dict(tokens=P32, expert_x=P32), **dshape, PART=part.value,
                    HAS_WEIGHTS=w, BLOCK_L=block_l, FP8=True, **_pdl(False))
                  for vec, part, w in (("ld+st", B.BOTH, False), ("ld+st", B.BOTH, True),
                                       ("ld+st", B.SEND, False), ("ld+st", B.RECV, False))],
               aligned=("stride_x",)),
        Kernel("trident.moe.combine", "combine_kernel", combine,
               [V("ld+st", **cshape, PART=B.BOTH.value, WEIGHTS_AT_DISPATCH=False,
                  BLOCK_T=BLOCK_T, **_pdl(True)),
                V("ld+st", **cshape, PART=B.BOTH.value, WEIGHTS_AT_DISPATCH=True,
                  BLOCK_T=BLOCK_T, **_pdl(False)),
                V("ld+st", **cshape, PART=B.SEND.value, WEIGHTS_AT_DISPATCH=False,
                  BLOCK_T=BLOCK_T, **_pdl(False)),
                V("ld+st", **cshape, PART=B.RECV.value, WEIGHTS_AT_DISPATCH=False,
                  BLOCK_T=BLOCK_T, **_pdl(False))],
               aligned=("stride_ye", "stride_yr")),
    ] + _moe_high_throughput(shape, block_l, dispatch, combine)


def _moe_high_throughput(shape, block_l, dispatch, combine) -> list[Kernel]:
    """The high-throughput path (trident/moe/high_throughput.py): same arguments plus the
    chunk flags, same 16-byte copies (remote pushes, local copies into expert_x, partial
    sums), in the fused launch and each split half."""
    from trident.moe import buffers as B
    from trident.moe.plans import BLOCK_T
    chunk = dict(CHUNK=B.CHUNK_TOKENS)
    return [
        Kernel("trident.moe.high_throughput", "ht_dispatch_kernel",
               dict(dispatch, chunk_flags=P64),
               [V("ld+st", **shape, **chunk, PART=part.value, HAS_WEIGHTS=w,
                  BLOCK_L=block_l, FP8=False, **_pdl(trace))
                for part, w, trace in ((B.BOTH, True, False), (B.BOTH, False, True),
                                       (B.SEND, False, False), (B.RECV, False, False))]
               + [V("ld+st", types=dict(tokens=P32, expert_x=P32), **shape, **chunk,
                    PART=part.value, HAS_WEIGHTS=False, BLOCK_L=block_l, FP8=True,
                    **_pdl(False)) for part in (B.BOTH, B.SEND, B.RECV)],
               aligned=("stride_x",)),
        Kernel("trident.moe.high_throughput", "ht_combine_kernel",
               dict(combine, chunk_flags=P64),
               [V("ld+st", **shape, **chunk, PART=part.value, WEIGHTS_AT_DISPATCH=at_d,
                  BLOCK_T=BLOCK_T, **_pdl(trace))
                for part, at_d, trace in ((B.BOTH, False, True), (B.BOTH, True, False),
                                          (B.SEND, False, False), (B.RECV, False, False))],
               aligned=("stride_ye", "stride_yr")),
    ]


def _trace_demo_bench() -> list[Kernel]:
    """The trace tools' kernels (the lab's trace_overhead among them: bench/lab/, found from
    the repository root), the demo's and the p2p benchmark's (constexprs as their callers
    set them on GPUs)."""
    from bench.lab import trace_overhead
    from trident.tools import ring
    return [
        Kernel("trident.tools.ring", "_ring_kernel",
               dict(inp=PF32, recv=PF32, out=PF32, ready=P64, acks=P64, n=I32, epoch=I64),
               [V("all", BLOCK=ring.BLOCK, TRACE=t) for t in (False, True)], aligned=("n",)),
        Kernel("bench.lab.trace_overhead", "_copy_kernel", dict(src=PF32, dst=PF32, n=I32),
               [V("all", BLOCK=trace_overhead.COPY_BLOCK, TRACE=t) for t in (False, True)],
               aligned=("n",)),
        Kernel("trident.tools.demo", "_ring_kernel",
               dict(src=PF32, dst=PF32, flag=P64, n=I32, round_no=I32),
               [V("all", BLOCK=1024)], aligned=("n",)),
        Kernel("trident.tools.demo", "_counter_kernel", dict(counter=P64, rounds=I32), [V()]),
        Kernel("trident.bench.p2p", "_p2p_kernel", dict(src=P32, dst=P32, n_blocks=I32),
               [V("all", 8, PUSH=push, BLOCK=4096) for push in (True, False)]),
    ]


def _language() -> list[Kernel]:
    """trident/language's helpers, through the kernels of their tests (the helpers are
    inlined; these are the kernels that use each of them)."""
    return [
        Kernel("tests.language.test_rma", "_atomics_kernel", dict(counters=P32, values=P32),
               [V()]),
        Kernel("tests.language.test_sync", "_wait_for_rank1_kernel", dict(flag=P32, ok=P32),
               [V()]),
        Kernel("tests.language.test_sync", "_barrier_rounds_kernel",
               dict(slots=P32, errors=P32, rounds=I32), [V()]),
        Kernel("tests.language.test_sync", "_ping_pong_kernel",
               dict(flags=P32, data=P32, log=P32, rounds=I32), [V()]),
        Kernel("tests.language.test_sync", "_timestamp_kernel", dict(out=P64), [V()]),
        # every helper called from a Gluon kernel (issue 22), with its memory semantics
        Kernel("tests.compile.gluon_api", "_device_api_kernel",
               dict(out=P32, inp=P32, flag=P64, n=I32), [V("ld+st", BLOCK=512, ptx_has=(
                   "ld.acquire.sys.global.b64", "atom.global.sys.release.exch.b64",
                   "atom.global.sys.release.add", "atom.global.acquire.gpu.cas.b64",
                   "atom.global.sys.acq_rel.add", "%globaltimer", "nanosleep",
                   "fence.proxy.async.global", "bar.sync"))],
               aligned=("n",)),
    ]


def _gluon_desc(dt: str, block: list) -> str:
    """The signature type of a host TensorDescriptor of `dt` ("bf16", "fp16") in blocks
    `block` with its NVMMA shared layout (as gemm_ws.descriptors makes them)."""
    from triton.experimental.gluon import language as gl
    ty = {"bf16": gl.bfloat16, "fp16": gl.float16}[dt]
    layout = gl.NVMMASharedLayout.get_default_for(block, ty)
    return f"tensordesc<{dt}[{block[0]},{block[1]}],{layout!r}>"


def _gemm_ws() -> list[Kernel]:
    """trident/ops/gemm_ws.py's warp-specialised Gluon GEMM: every WS candidate (bf16;
    split-K ones SPLIT), one with a bias and one fp16; each must show warp specialisation
    (setmaxnreg), wgmma, TMA copies, 16-byte output stores, and fit sm_90's shared
    memory."""
    from trident.ops import gemm_configs, gemm_ws
    variants = []

    def add(cfg, dt="bf16", bias=False):
        warps_m, instr_n = gemm_ws.wgmma_shape(cfg["BM"], cfg["BN"], cfg["num_warps"])
        variants.append(V(vectors="st", num_warps=cfg["num_warps"], num_stages=1,
                          types=dict(a_desc=_gluon_desc(dt, [cfg["BM"], cfg["BK"]]),
                                     w_desc=_gluon_desc(dt, [cfg["BN"], cfg["BK"]]),
                                     out=f"*{dt}", bias=f"*{dt}"),
                          ptx_has=("setmaxnreg", "wgmma.mma_async", "cp.async.bulk.tensor"),
                          NUM_PROGRAMS=132, GROUP_M=cfg["GROUP_M"], STAGES=cfg["num_stages"],
                          HAS_BIAS=bias, SPLIT=cfg["SPLIT_K"] > 1,
                          CONSUMER_WARPS=cfg["num_warps"], WARPS_M=warps_m,
                          INSTR_N=instr_n, TPW_N=min(32, cfg["BN"] // 8)))

    compiled = set()                    # a TAIL config compiles as its split-K twin does
    for cfg in gemm_configs.WS_CANDIDATES.values():
        kernel = (cfg["BM"], cfg["BN"], cfg["BK"], cfg["num_stages"], cfg["num_warps"],
                  cfg["SPLIT_K"] > 1)
        if kernel not in compiled:
            compiled.add(kernel)
            add(cfg)
    add(gemm_configs.WS_CANDIDATES["ws128x128x64_s6_w8"], bias=True)
    add(gemm_configs.WS_CANDIDATES["ws64x128x128_s4_w4"], "fp16", bias=True)
    return [Kernel("trident.ops.gemm_ws", "gemm_ws_kernel",
                   dict(partials=PF32, counters=P32, M=I32, N=I32, K=I32, stride_om=I32,
                        split_k=I32, whole=I32), variants,
                   aligned=("N", "K", "stride_om"))]


def _fused_gluon() -> list[Kernel]:
    """trident/ops/fused_gluon.py: all_gather_matmul's warp-specialised Gluon core, at three
    WS configs (BM 128 with two consumer warp groups, BM 64 with one, a split-K one), bf16
    and fp16, with and without bias, blocks that straddle ranks or not, traced once. Each
    must show warp specialisation (setmaxnreg), wgmma, TMA copies, the producer's one-warp
    vote (vote.sync) and the async-proxy fence after its waits, the pushers' 16-byte
    copies, and fit sm_90's shared memory."""
    from trident.ops import fused_gluon, gemm_configs
    variants = []
    cases = (("ws128x128x64_s6_w8", "bf16", True, True, False),
             ("ws64x128x128_s4_w4", "fp16", False, False, True),
             ("ws128x64x64_s8_w4_sk4", "bf16", True, False, False))
    for name, dt, bias, aligned, trace in cases:
        cfg = gemm_configs.WS_CANDIDATES[name]
        cx = fused_gluon.constexprs(cfg, 16, 32, 256, aligned, bias, cfg["SPLIT_K"] > 1, trace)
        warps = cx.pop("num_warps")
        variants.append(V("ld+st", num_warps=warps, num_stages=1,
                          types=dict(a=f"*{dt}", gathered=f"*{dt}", out=f"*{dt}",
                                     bias=f"*{dt}",
                                     a_desc=_gluon_desc(dt, [cfg["BM"], cfg["BK"]]),
                                     w_desc=_gluon_desc(dt, [cfg["BN"], cfg["BK"]])),
                          ptx_has=("setmaxnreg", "wgmma.mma_async", "cp.async.bulk.tensor",
                                   "vote.sync.all.pred", "fence.proxy.async.global",
                                   "ld.acquire.sys.global"), **cx))
    ints = ("m_local", "M", "N", "K", "stride_am", "stride_om")
    return [Kernel("trident.ops.fused_gluon", "_all_gather_matmul_gluon_kernel",
                   dict(sync=P32, k_partials=PF32, k_counters=P32, split_k=I32,
                        **dict.fromkeys(ints, I32)), variants, aligned=ints)]


def _matmul_reduce_gluon() -> list[Kernel]:
    """trident/ops/matmul_reduce_gluon.py: the row-parallel ops' warp-specialised Gluon
    core, at three WS configs (a 128x256 tile with two consumer warp groups, BM 64 with
    one, a split-K one), bf16 and fp16, with and without bias,
    reduce-scatter and all-reduce, traced once. Each must show warp specialisation
    (setmaxnreg), wgmma, TMA copies, the acquire of the waits and the consumers' vote over
    their own threads (bar.red with a count: no whole-block barrier), the 16-byte pushes
    and reducer loads, and fit sm_90's shared memory."""
    from trident.ops import gemm_configs, matmul_reduce_gluon
    from trident.runtime.errors import OP_CODES
    variants = []
    cases = (("ws128x256x64_s4_w8", "bf16", True, True, False),     # the most shared memory
             ("ws64x128x128_s4_w4", "fp16", False, False, True),
             ("ws128x64x64_s8_w4_sk4", "bf16", False, True, False))
    for name, dt, bias, all_reduce, trace in cases:
        cfg = gemm_configs.WS_CANDIDATES[name]
        op = OP_CODES["matmul_all_reduce" if all_reduce else "matmul_reduce_scatter"]
        cx = matmul_reduce_gluon.constexprs(cfg, bias, all_reduce, cfg["SPLIT_K"] > 1, op,
                                            trace)
        warps = cx.pop("num_warps")
        variants.append(V("ld+st", num_warps=warps, num_stages=1,
                          types=dict(out=f"*{dt}", bias=f"*{dt}", partials=f"*{dt}",
                                     result=f"*{dt}",
                                     a_desc=_gluon_desc(dt, [cfg["BM"], cfg["BK"]]),
                                     w_desc=_gluon_desc(dt, [cfg["BN"], cfg["BK"]])),
                          ptx_has=("setmaxnreg", "wgmma.mma_async", "cp.async.bulk.tensor",
                                   "ld.acquire.sys.global", "bar.red.and.pred %pout, 0, "),
                          **cx))
    ints = ("M", "N", "K", "m_local", "stride_om")
    return [Kernel("trident.ops.matmul_reduce_gluon", "_matmul_reduce_gluon_kernel",
                   dict(sync=P32, k_partials=PF32, k_counters=P32, split_k=I32, num_tiles=I32,
                        slots=I32, num_gemm=I32, **dict.fromkeys(ints, I32)), variants,
                   aligned=ints)]


def kernels() -> list[Kernel]:
    return (_ccl() + _ops() + _gemm() + _gemm_ws() + _fused_gluon() + _matmul_reduce_gluon()
            + _pipelined() + _moe() + _trace_demo_bench() + _language())


def main(argv: list[str]) -> int:
    ptx_dir = None
    if argv and argv[0].startswith("--ptx-dir"):
        ptx_dir = argv[0].partition("=")[2] or argv[1]
        argv = argv[1:] if "=" in argv[0] else argv[2:]
        os.makedirs(ptx_dir, exist_ok=True)
    chosen = [k for k in kernels() if not argv or any(a in k.label for a in argv)]
    if not chosen:
        print(f"no kernel matches {argv}", file=sys.stderr)
        return 2
    t0, count = time.perf_counter(), 0
    _JOBS[:] = [(k, i, ptx_dir) for k in chosen for i in range(len(k.variants))]
    with _workers() as pool:
        for line in pool.map(_compile_job, range(len(_JOBS)), chunksize=1):
            print(line, flush=True)
            count += 1
    print(f"{count} compilations of {len(chosen)} kernels for sm_90 in "
          f"{time.perf_counter() - t0:.0f} s: ok")
    return 0


_JOBS: list = []       # (kernel, variant index, ptx_dir): the forked workers inherit it


def _compile_job(n: int) -> str:
    return compile_variant(*_JOBS[n])


def _workers():
    """Processes that compile variants side by side, one per CPU core (at most 8;
    SM90_JOBS in the environment: another number, 1 compiles here): Triton's compiles and
    ptxas are single-threaded, and this check is the suite's longest test. Forked, so the
    kernels' modules come imported and _JOBS need not be pickled; Triton's file cache
    takes concurrent writers."""
    import concurrent.futures
    import multiprocessing
    jobs = int(os.environ.get("SM90_JOBS", "0")) or min(8, os.cpu_count() or 1)
    if jobs == 1:
        return _Here()
    return concurrent.futures.ProcessPoolExecutor(
        jobs, mp_context=multiprocessing.get_context("fork"))


class _Here:
    """A pool of one: this process."""
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @staticmethod
    def map(fn, items, chunksize=1):
        return map(fn, items)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
