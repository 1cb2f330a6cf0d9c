"""The import graph of trident/ (issues 23, 32 and 42): no import circle anywhere in the
package, the context's modules in none either (trident.api.Context is the facade over
ccl/, ops/, trace/ and sanitize/, which take the context as an argument and never import
it; the runtime's context imports no family: docs/design.md, Layout; the layers
themselves: tests/test_layers.py), every module importable on its own in a fresh
interpreter, and no file over 600 lines.

The graph is read from the source with ast: imports at module level and inside functions
(the facade's lazy ones included; module_level=True: only the former), and
importlib.import_module with a literal name, not those under `if TYPE_CHECKING:`;
relative imports are resolved. An import of a.b.c also imports the
packages a.b (their __init__ runs), except the packages the importing module lies in
(loaded before it) and the root package `trident`."""
import ast
import os
import pathlib
import subprocess
import sys

import trident

ROOT = pathlib.Path(trident.__file__).parent


def _modules() -> dict[str, pathlib.Path]:
    files = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def imported_modules(mod: str, path: pathlib.Path, files,
                     module_level: bool = False) -> list[tuple[int, str]]:
    """(line, trident module) for each import in `mod`'s source (see the module
    docstring): `from x import function` counts as module x, `from trident import init`
    (or `import trident`) as "trident", importlib.import_module("trident....") with a
    literal name too. module_level: only the imports that run when mod is imported (none
    inside a function's body)."""
    out, stack = [], [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                              ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:          # relative to mod's package (mod itself if a package)
                parts = mod.split(".")
                pkg = parts[:len(parts) - node.level + (path.name == "__init__.py")]
                base = ".".join(pkg + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" for a in node.names]
        elif (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module")
              and node.args and isinstance(node.args[0], ast.Constant)):
            names = [str(node.args[0].value)]
        else:
            continue
        for name in names:
            if name == "trident" or name.startswith("trident."):
                while name not in files:            # `from x import function`: module x
                    name = name.rpartition(".")[0]
                out.append((node.lineno, name))
    return out


def _imports(mod: str, path: pathlib.Path, files, module_level: bool = False) -> set[str]:
    """The trident modules that `mod` imports, with the packages each import loads on the
    way (imported_modules; not the root package, nor mod's own packages)."""
    out = set()
    for _, name in imported_modules(mod, path, files, module_level):
        while name and name != "trident":           # the module and its packages
            if name != mod and not mod.startswith(name + "."):
                out.add(name)
            name = name.rpartition(".")[0]
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on_stack.discard(comp[-1])
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_graph_sees_the_facade_imports():
    files = _modules()
    graph = {m: _imports(m, p, files) for m, p in files.items()}
    # the facade's lazy, function-level imports are edges (else the test below proves nothing)
    assert {"trident.ccl", "trident.ops"} <= graph["trident.api.context_ops"]
    assert "trident.runtime.emulation" in graph["trident.runtime.context"]
    assert {"trident.sanitize", "trident.nodes.world"} <= graph["trident.api.context"]
    assert "trident.api" in graph["trident"]


def _describe(graph, cycles) -> str:
    return "; ".join(" ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in cycles)


def test_no_import_cycle_in_trident():
    """No circle anywhere in trident/, neither among the imports that run when a module is
    imported nor once the lazy ones (inside functions) are counted (issue 32: a lazy
    import that closes a circle hides which module needs which)."""
    files = _modules()
    for module_level in (True, False):
        graph = {m: _imports(m, p, files, module_level) for m, p in files.items()}
        found = _cycles(graph)
        assert not found, (f"import cycles ({'module-level' if module_level else 'lazy'} "
                           f"imports included): " + _describe(graph, found))


def test_context_is_in_no_import_cycle():
    files = _modules()
    graph = {m: _imports(m, p, files) for m, p in files.items()}
    context = {m for m in files if m.startswith(("trident.runtime.context", "trident.api"))}
    bad = [c for c in _cycles(graph) if context & set(c)]
    assert not bad, "import cycles through the context: " + _describe(graph, bad)


MAX_LINES = 600


def test_no_file_over_600_lines():
    """Files small and single-purpose: none in trident/ over MAX_LINES lines (issue 32)."""
    long = {str(p.relative_to(ROOT.parent)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files in trident/ over {MAX_LINES} lines (split them): {long}"


def test_no_dated_notes_in_source():
    """Dated measurements belong in docs/ (docs/history.md, docs/results.md) and
    bench/results/, not in source files, where they go stale unseen (issue 42)."""
    import re
    dated = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
    found = [f"{p.relative_to(ROOT.parent)}:{i}" for p in ROOT.rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if dated.search(line)]
    assert not found, f"dated notes in source (move them to docs/history.md): {found}"


# Imports each module named in argv in a process of its own, forked from one that has
# loaded only the third-party packages: every module starts from no trident module loaded,
# as in a fresh interpreter, without paying torch's import for each.
_FRESH = r"""
import importlib, os, sys, traceback
import numpy, torch, triton  # noqa: F401,E401
failed = []
for name in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(name)
            os._exit(0)
        except BaseException:
            os.write(w, traceback.format_exc().encode())
            os._exit(1)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode(errors="replace")
    status = os.waitpid(pid, 0)[1]
    if status:
        failed.append(f"--- import {name} failed (status {status}):\n{err}")
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_module_imports_in_a_fresh_interpreter():
    """Each module of trident/ imports alone, first of its package's modules (an import
    that works only after another module was loaded fails here)."""
    names = sorted(m for m in _modules() if not m.endswith("__main__"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT.parent)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    proc = subprocess.run([sys.executable, "-c", _FRESH, *names], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
