"""ccl/registry.py: every algorithm is declared once, and the call path, the options
check, the selector and the bench read that declaration (no process group needed)."""
from __future__ import annotations

import inspect

import pytest

from trident import ccl
from trident.bench import ccl as bench_ccl
from trident.ccl import options, registry, selector

from .. import algorithms


def _signature_knobs(fn) -> tuple:
    """What ccl/options.py inferred before the registry: keyword options besides block
    and programs, in the signature's order."""
    params = inspect.signature(fn).parameters
    return tuple(p for p, v in params.items() if p not in ("ctx", "plan", "block", "programs")
                 and (v.kind == v.KEYWORD_ONLY or v.default is not v.empty))


def check_declaration(algorithm) -> None:
    """Its run function is its module's, and its knobs are the function's."""
    fn = algorithm.run()
    assert fn.__module__ == f"trident.ccl.{algorithm.module}"
    assert _signature_knobs(fn) == algorithm.knobs


@pytest.mark.parametrize("algorithm", registry.ALGORITHMS, ids=lambda a: f"{a.op}-{a.name}")
def test_declared_knobs_are_the_run_function_s(algorithm):
    check_declaration(algorithm)


def test_the_tests_excuse_only_registry_algorithms():
    """tests/algorithms.py EXCUSED, the one place where a test leaves out an algorithm of
    the registry (or a schedule of trident/ops/schedules.py), names algorithms of the
    registry, each with its reason."""
    from trident.ops import schedules
    for (family, op, name), why in algorithms.EXCUSED.items():
        names = schedules.registered() if op == "schedules" else registry.names(op)
        assert name in names and family and why.strip(), (family, op, name)


def test_call_path_reads_the_registry():
    assert list(ccl.ALGORITHMS) == list(registry.OPS)
    for op in registry.OPS:
        assert list(ccl.ALGORITHMS[op]) == [a.name for a in registry.kernels(op)]
        for name, fn in ccl.ALGORITHMS[op].items():
            assert fn is registry.get(op, name).run()
        assert ccl._NEEDS_NCCL[op] == ["nccl"]
    assert set(ccl._OPS) == set(registry.OPS)


def test_nccl_is_declared_once_per_op():
    """"nccl" is every op's: engine "torch" (no knobs, NCCL needed), its run function
    ccl/nccl.py's function of the op, last in each op's names, and no kernel of trident."""
    from trident.ccl import nccl
    for op in registry.OPS:
        a = registry.get(op, "nccl")
        assert (a.engine, a.knobs, a.needs_nccl, a.auto) == ("torch", (), True, True)
        assert a.run() is getattr(nccl, op)
        assert registry.names(op)[-1] == "nccl"
        assert a not in registry.kernels(op)
        assert all(k.engine == "trident" and not k.needs_nccl for k in registry.kernels(op))
    assert registry.needs_nccl() == {"nccl"}
    with pytest.raises(AssertionError, match="bad declaration"):
        registry.Algorithm("all_reduce", "x", "nccl", ("warps",), engine="torch")


def test_options_check_reads_the_registry():
    class Ctx:                      # what knobs() reads of a context: nothing for these
        backend = "cpu"
    with pytest.raises(ValueError, match=r"all_gather pull: unknown option\(s\) \['chunk'\]; "
                                         r"it takes \['warps', 'order'\]"):
        options.knobs(Ctx(), "all_gather", "pull", (("chunk", 8),))
    with pytest.raises(ValueError, match="order must be one of"):
        options.knobs(Ctx(), "all_gather", "pull", (("order", "sideways"),))
    assert options.knobs(Ctx(), "all_reduce", "two_shot", (("warps", 4),)) == {"warps": 4}
    # nccl (engine "torch") takes no options and ignores launch sizes
    with pytest.raises(ValueError, match=r"^broadcast: nccl takes no options, got \{'depth': 4\}$"):
        options.knobs(Ctx(), "broadcast", "nccl", (("depth", 4),))
    assert options.knobs(Ctx(), "all_reduce", "nccl", (), block=-3, programs=0) == {}


def test_selector_reads_the_registry():
    assert selector.EXPLICIT_ONLY == {a.name for a in registry.ALGORITHMS if not a.auto}
    assert selector.NEEDS_NCCL == {a.name for a in registry.ALGORITHMS if a.needs_nccl}
    doc = selector.builtin()
    tables = [doc["cost_model"]] + list(doc.get("world_sizes", {}).values())
    for entry in tables:
        for mode in selector.MODES:
            for op, rows in entry.get(mode, {}).items():
                for _, name in rows:
                    a = registry.get(op, name)
                    assert a is not None and a.auto, (op, name)


def test_bench_reads_the_registry(monkeypatch):
    seen = []
    monkeypatch.setattr(bench_ccl, "_call", lambda ctx, op, sym, algorithm=None: seen.append(
        (op, algorithm)))
    monkeypatch.setattr(bench_ccl.common, "baseline_name", lambda ctx: "gloo")
    monkeypatch.setattr(bench_ccl.common, "nccl_runs", lambda ctx: False)
    for op in registry.OPS:
        for size, limited in ((1 << 10, False), (bench_ccl.SCRATCH_LIMIT * 2, True)):
            seen.clear()
            bench_ccl._impls(None, op, size, None, None, full=False)
            want = [(op, a.name) for a in registry.kernels(op)
                    if not (limited and a.scratch == "message")]
            assert seen == want, (op, size)


def test_bench_baseline_is_the_registry_s_nccl(monkeypatch):
    """bench/ccl.py's baseline calls the run function of the registry's "nccl" entry (the
    one the call path adds to a plan), with the op's options: sum, root 0, even splits."""
    from trident.ccl import nccl
    calls = []
    for op in registry.OPS:
        monkeypatch.setattr(nccl, op, lambda *args, op=op: calls.append((op, args)))
    t, o, i = object(), object(), object()       # stand-ins for the buffers
    want = {"all_reduce": ([t], ("sum",)), "broadcast": ([t], (0,)), "all_gather": ([o, i], ()),
            "reduce_scatter": ([o, i], ("sum",)), "all_to_all": ([o, i], (None, None))}
    for op, (bufs, own) in want.items():
        bench_ccl._nccl("ctx", op, bufs)()
        assert calls[-1] == (op, ("ctx", *bufs, *own)), op
    assert len(calls) == len(want)


def test_launch_size_overrides_are_checked_not_defaulted():
    """programs=0 (or a float, or True) is refused, not read as the default (None is)."""
    class Ctx:
        backend = "cpu"
    for bad in (0, -1, 2.0, True, "4"):
        with pytest.raises(ValueError, match=r"all_reduce: programs must be an int in 1\.\."):
            options.knobs(Ctx(), "all_reduce", "one_shot", (), programs=bad)
    with pytest.raises(ValueError, match="block must be a power of two, got 0"):
        options.knobs(Ctx(), "all_reduce", "one_shot", (), block=0)
    assert options.knobs(Ctx(), "all_reduce", "one_shot", (), block=64, programs=3) == {}
