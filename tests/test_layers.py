"""The layers of trident/ (issue 42): each family is a folder, and a module imports only
from its own family or from the families below it -- never one above, nor a sibling on
its own floor. LAYERS below is the order, lowest first, written once here; docs/design.md
("Layout") draws the same tree.

The imports are read from the source as tests/test_imports.py reads them (ast: at module
level and inside functions, importlib.import_module with a literal name, relative imports
resolved). `import trident` (the root package: __init__.py, __main__.py and the public
alias errors.py) is the top floor, which only the root's own modules may import.
"""
import pytest

from .test_imports import ROOT, _modules as modules, imported_modules

# Lowest first. Families on one floor may not import each other.
LAYERS = [
    ("runtime",),             # context, heap, launch, plans, placement, errors, emulation
    ("language",),            # the device API (@triton.jit helpers)
    ("trace", "sanitize"),    # intra-kernel events; the CPU race detector
    ("ccl",),                 # collectives
    ("ops", "moe"),           # GEMM + communication; expert-parallel dispatch/combine
    ("nodes",),               # worlds of several nodes, over ccl, ops and moe
    ("api",),                 # trident.Context and trident.init: the families on a context
    ("torch",),               # custom ops and the torch.distributed backend
    ("compat", "bench"),      # DeepEP's API; the benchmarks behind `trident bench`
    ("tools",),               # the command line and its programs
    ("trident",),             # the root package: trident/__init__.py, __main__.py, errors.py
]
FLOOR = {family: i for i, floor in enumerate(LAYERS) for family in floor}


def family(module: str) -> str:
    """'trident.ccl.all_gather.push' -> 'ccl'; the root's own modules -> 'trident'."""
    parts = module.split(".")
    if len(parts) == 1 or (ROOT / f"{parts[1]}.py").is_file():
        return "trident"
    return parts[1]


def violations(files) -> list[str]:
    bad = []
    for module, path in sorted(files.items()):
        mine = family(module)
        for line, target in imported_modules(module, path, files):
            theirs = family(target)
            if theirs == mine:
                continue
            if FLOOR[theirs] > FLOOR[mine]:
                why = "a higher layer"
            elif FLOOR[theirs] == FLOOR[mine]:
                why = "a sibling on its own layer"
            else:
                continue
            bad.append(f"{module}:{line} ({mine}) imports {target} ({theirs}), {why}")
    return bad


def test_every_family_has_a_layer():
    """A new top-level folder or file of trident/ must be given its place in LAYERS."""
    unplaced = sorted({family(m) for m in modules()} - set(FLOOR))
    assert not unplaced, f"families with no layer in tests/test_layers.py LAYERS: {unplaced}"


def test_no_import_runs_up():
    bad = violations(modules())
    assert not bad, "imports that run up the layers (tests/test_layers.py LAYERS):\n" + \
        "\n".join(bad)


@pytest.mark.parametrize("source, line", [
    ("runtime.plans", "from ..ccl import registry"),                 # runtime -> ccl
    ("ccl.selector", "def f():\n    from ..nodes import cost\n"),   # in a function
    ("ops.tuning", "from trident.bench import common"),             # ops -> bench
    ("moe.plans", "from .. import ops"),                            # a sibling
    ("runtime.launch", "import trident"),                           # the root package
    ("ccl.common", "import importlib\nimportlib.import_module('trident.torch.ops')"),
])
def test_an_import_that_runs_up_fails(tmp_path, source, line):
    """The check sees each kind of import that runs up: the package's own tree with one
    module (`source`) replaced by `line`."""
    name = f"trident.{source}"
    fake = tmp_path / (source.replace(".", "_") + ".py")
    fake.write_text(line + "\n")
    bad = violations({**modules(), name: fake})
    assert [b for b in bad if b.startswith(name + ":")], bad
