"""Every collective algorithm, declared once: its op, name, run function, knobs, scratch use
and whether "auto" may pick it. The options check (options.py), the call path
(ccl/__init__.py), the selector (selector.py) and the bench (bench/ccl.py) read this table
and nothing else, so adding an algorithm touches its own file and one line here
(docs/design.md, "Adding an algorithm", has a worked example).

An algorithm's file (e.g. all_gather/push.py) holds its kernel and its run function,
`fn(ctx, plan, <the op's arguments>, block=None, programs=None, <knobs>)`, which adds the
kernel's launch to the plan (the op's arguments: ccl/__init__.py's `_OPS` says which).
If some knob values are invalid, it also defines `check_options(ctx, word, block,
**knobs)`, which raises ValueError for them before anything is launched (so that a call
that launches nothing -- one rank, an empty tensor -- rejects them alike).

"nccl" is declared here too, once per op, with engine="torch": it hands the call to
torch.distributed (ccl/nccl.py: its run function is that module's function of the op,
`fn(ctx, <the op's tensors and options>)`, added to the plan as a step that is not
graphable). It launches no trident kernel, so it takes no knobs and ignores launch sizes,
runs at one rank and on empty tensors too, and can run only where every rank has a GPU of
its own (`needs_nccl`; the call path, the selector and the bench check
ctx.nccl_available). `kernels(op)` are trident's own algorithms (ccl.ALGORITHMS).

This module imports no kernel: the run functions are imported on first use (`run`), so
the selector and `trident info` stay light.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast")
SCRATCH = ("message", "bounded")
ENGINES = ("trident", "torch")
DTYPES = ("any", "float")


@dataclass(frozen=True)
class Algorithm:
    """One algorithm of one collective.

    op, name: e.g. ("all_gather", "push"); `algorithm=name` asks for it.
    module: its file under trident/ccl/ ("all_gather.push"); the run function is the
      module's attribute `name`.
    knobs: the keyword options it takes besides block and programs, in its signature's
      order (tests/ccl/test_registry.py checks them against the signature).
    scratch: "message" -- it keeps 2 * world * message bytes of heap scratch (the bench
      stops it at bench.ccl.SCRATCH_LIMIT); "bounded" -- none, or a buffer whose size does
      not grow with the message.
    auto: whether "auto" may pick it (the selector's tables may name it). False keeps an
      algorithm opt-in until it is measured.
    engine: "trident" -- it launches trident's kernels; "torch" -- it hands the call to
      torch.distributed (the "nccl" algorithm: no knobs, no launch sizes, NCCL needed).
    function: the run function's name in its module, where it is not `name`.
    dtypes: "any" -- every dtype the op takes (a reduction's: ccl/common.py
      REDUCE_DTYPES, integers included); "float" -- floating-point tensors only. The call
      path never runs it on others: "auto" takes the op's first declared algorithm that
      does instead, a call that names it raises TypeError (ccl/__init__.py `_algorithm`).
    """
    op: str
    name: str
    module: str
    knobs: tuple = ()
    scratch: str = "message"
    auto: bool = True
    engine: str = "trident"
    function: str = ""
    dtypes: str = "any"

    def __post_init__(self):
        if (self.op not in OPS or self.scratch not in SCRATCH or self.engine not in ENGINES
                or self.engine == "torch" and self.knobs or self.dtypes not in DTYPES):
            raise AssertionError(f"bad declaration {self}")

    def takes(self, dtype) -> bool:
        """Whether it runs on tensors of torch dtype `dtype` (see `dtypes`)."""
        return self.dtypes == "any" or dtype.is_floating_point

    @property
    def needs_nccl(self) -> bool:
        """Whether it runs only where NCCL can (every rank a GPU of its own: ccl/nccl.py)."""
        return self.engine == "torch"

    def _module(self):
        return importlib.import_module(f"trident.ccl.{self.module}")

    def run(self):
        """The run function (its module imported on first use)."""
        return getattr(self._module(), self.function or self.name)

    def fits(self, ctx, nbytes: int) -> bool:
        """Whether a message of `nbytes` per rank is within what it takes (a module-level
        `fits(ctx, nbytes)` in its file says; else any size): "auto" passes over it
        where it does not (a table may name it up to a size a smaller heap cannot hold)."""
        fits = getattr(self._module(), "fits", None)
        return fits is None or fits(ctx, nbytes)

    def check_options(self, ctx, word: int, block, knobs: dict) -> None:
        """The algorithm's own check of its knob values (`word`: the bytes of the elements
        it moves), where its file defines one."""
        check = getattr(self._module(), "check_options", None)
        if check is not None:
            check(ctx, word, block, **knobs)


# gluon (all_gather/gluon.py): tied push within noise in the one 2x H200 run so far; it
# stays opt-in until it is measured on more machines and sizes.
ALGORITHMS = (
    Algorithm("all_gather", "push", "all_gather.push"),
    Algorithm("all_gather", "pull", "all_gather.pull", ("warps", "order"), "bounded"),
    Algorithm("all_gather", "push_direct", "all_gather.push_direct", ("warps",), "bounded"),
    Algorithm("all_gather", "gluon", "all_gather.gluon", ("warps",), auto=False),
    Algorithm("all_gather", "lamport", "all_gather.lamport", ("warps",), "bounded"),
    Algorithm("reduce_scatter", "push", "reduce_scatter.push"),
    Algorithm("reduce_scatter", "pull", "reduce_scatter.pull", ("warps",), "bounded"),
    Algorithm("reduce_scatter", "lamport", "reduce_scatter.lamport", ("warps",), "bounded",
              dtypes="float"),
    Algorithm("all_reduce", "one_shot", "all_reduce.one_shot"),
    Algorithm("all_reduce", "lamport", "all_reduce.lamport", ("warps",), "bounded", dtypes="float"),
    Algorithm("all_reduce", "two_shot", "all_reduce.two_shot", ("warps",), "bounded"),
    Algorithm("all_to_all", "push", "all_to_all.push", ("warps",), "bounded"),
    Algorithm("all_to_all", "one_shot", "all_to_all.one_shot", (), "bounded"),
    Algorithm("all_to_all", "lamport", "all_to_all.lamport", ("warps",), "bounded"),
    Algorithm("broadcast", "push", "broadcast.push"),
    Algorithm("broadcast", "relay", "broadcast.relay", ("chunk", "depth", "warps"), "bounded"),
    Algorithm("broadcast", "lamport", "broadcast.lamport", ("warps",), "bounded"),
) + tuple(Algorithm(op, "nccl", "nccl", (), "bounded", engine="torch", function=op)
          for op in OPS)      # torch.distributed: ccl/nccl.py's function of the op


def get(op: str, name: str) -> Algorithm | None:
    """The declaration of `op`'s algorithm `name`, or None. Read from ALGORITHMS at each
    call (a plan's build, not the warm path), as every function here is, so that the
    table is the one truth: tests declare a throwaway algorithm by replacing it."""
    return next((a for a in ALGORITHMS if a.op == op and a.name == name), None)


def names(op: str) -> list[str]:
    """`op`'s algorithms, in declaration order ("nccl" last)."""
    return [a.name for a in ALGORITHMS if a.op == op]


def kernels(op: str) -> list[Algorithm]:
    """`op`'s own algorithms, those that launch trident's kernels (not "nccl")."""
    return [a for a in ALGORITHMS if a.op == op and a.engine == "trident"]


def needs_nccl() -> frozenset:
    """The names of algorithms that run only where NCCL can ("nccl")."""
    return frozenset(a.name for a in ALGORITHMS if a.needs_nccl)


def explicit_only() -> frozenset:
    """The names of algorithms that "auto" never picks (asked for by name only)."""
    return frozenset(a.name for a in ALGORITHMS if not a.auto)


def run_functions() -> dict:
    """{op: {name: run function}} of trident's own algorithms (`kernels`; imports every
    algorithm's file)."""
    return {op: {a.name: a.run() for a in kernels(op)} for op in OPS}
