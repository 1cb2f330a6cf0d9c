"""trident/runtime/options.py (issue 42 item 3): every TRIDENT_* variable of the package is
declared there and read nowhere else; a bad value raises a ValueError that names it; a
Context reads them when it is made, so a variable set after `import trident` counts from
the next context; docs/options.md is what the declarations print."""
import dataclasses
import os
import pathlib
import re

import pytest

import trident as td
from trident.runtime import options

from .conftest import ONCE_WORLD, get_pool

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "trident").rglob("*.py"))


def test_every_trident_variable_is_declared():
    """A TRIDENT_* name in the package is a declared variable, unless the package defines
    it as a Python name (trident.torch.backend.TRIDENT_OPS)."""
    texts = [path.read_text() for path in SOURCES]
    found = {v for text in texts for v in re.findall(r"\bTRIDENT_[A-Z0-9_]*[A-Z0-9]\b", text)}
    python = {v for text in texts for v in re.findall(r"^(TRIDENT_[A-Z0-9_]+)\s*=", text, re.M)}
    missing = sorted(found - python - set(options.VARIABLES))
    assert found and not missing, f"not declared in trident/runtime/options.py: {missing}"


def test_only_options_reads_the_environment():
    readers = [str(p.relative_to(ROOT)) for p in SOURCES
               if re.search(r"os\.environ|getenv", p.read_text())]
    assert len(readers) <= 3 and "trident/runtime/options.py" in readers, readers


@pytest.mark.parametrize("name, value", [
    ("TRIDENT_HEAP_SIZE", "1G"), ("TRIDENT_HEAP_SIZE", "0"), ("TRIDENT_DEBUG", "maybe"),
    ("TRIDENT_MPS", "sometimes"), ("TRIDENT_GEMM", "cutlass"), ("TRIDENT_PLAN_GRAPHS", "some"),
    ("TRIDENT_PLAN_CACHE", "-1"), ("TRIDENT_NODE_SIZE", "two"), ("TRIDENT_BACKEND", "gpu"),
    ("TRIDENT_INTERNODE_US", "0"), ("TRIDENT_INTERNODE_GBPS", "nan"),
    ("TRIDENT_MOE_HT_MIN_TOKENS", "-5"), ("TRIDENT_SANITIZE_SEED", "x")])
def test_a_bad_value_names_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=rf"^{name} must be .*, got {value!r}$"):
        options.get(name)
    with pytest.raises(ValueError, match=name):
        options.snapshot()


def test_values_and_defaults(monkeypatch):
    for v in options.TRIDENT:
        monkeypatch.delenv(v.name, raising=False)
    defaults = options.snapshot()
    assert defaults.heap_size == 1 << 30 and defaults.gemm == "auto" and not defaults.debug
    assert defaults.node_size is None and defaults.plan_cache == 512
    monkeypatch.setenv("TRIDENT_HEAP_SIZE", " 4096 ")
    monkeypatch.setenv("TRIDENT_GEMM", "TMA")
    monkeypatch.setenv("TRIDENT_DEBUG", "1")
    monkeypatch.setenv("TRIDENT_NODE_SIZE", "")              # empty: unset
    got = options.snapshot()
    assert (got.heap_size, got.gemm, got.debug, got.node_size) == (4096, "tma", True, None)
    assert options.get("LOCAL_RANK", 7, env={}) == 7         # `otherwise` for an unset one
    assert options.get("TRIDENT_MPS", env={"TRIDENT_MPS": "off"}) == "off"
    with pytest.raises(KeyError, match="not declared"):
        options.get("NOT_A_DECLARED_VARIABLE")


def test_exported_puts_back_what_was_there(monkeypatch):
    monkeypatch.setenv("TRIDENT_JOB_ID", "before")
    monkeypatch.delenv("TRIDENT_NODE_SIZE", raising=False)
    with options.exported({"TRIDENT_JOB_ID": "during", "TRIDENT_NODE_SIZE": 2}):
        assert options.get("TRIDENT_JOB_ID") == "during" and options.get("TRIDENT_NODE_SIZE") == 2
    assert options.get("TRIDENT_JOB_ID") == "before" and options.raw("TRIDENT_NODE_SIZE") is None


def _read_per_context(ctx):
    """A variable set after import counts from the next context; the open one keeps its
    snapshot (and its plans' capacity, read from it)."""
    saved = os.environ.get("TRIDENT_PLAN_CACHE")
    os.environ["TRIDENT_PLAN_CACHE"] = "7"
    try:
        with td.init(heap_size=1 << 20, group=ctx.group) as other:
            got = (other.options.plan_cache, other.plans.capacity, ctx.options.plan_cache)
        os.environ["TRIDENT_PLAN_CACHE"] = "many"
        with pytest.raises(ValueError, match="TRIDENT_PLAN_CACHE"):
            td.init(heap_size=1 << 20, group=ctx.group)
    finally:
        if saved is None:
            os.environ.pop("TRIDENT_PLAN_CACHE")
        else:
            os.environ["TRIDENT_PLAN_CACHE"] = saved
    assert dataclasses.replace(ctx.options, plan_cache=3).plan_cache == 3
    return got


def test_read_once_per_context():
    got = get_pool(ONCE_WORLD).run(_read_per_context)
    assert all(g[:2] == (7, 7) and g[2] != 7 for g in got), got


def test_the_docs_page_is_the_declarations():
    """docs/options.md: markdown() of the declarations, then the tests' variables."""
    page = (ROOT / "docs" / "options.md").read_text()
    assert page.startswith(options.markdown() + "\n## "), \
        ("docs/options.md does not begin with the declarations: replace its tables with "
         "python -c 'from trident.runtime.options import markdown; print(markdown())'")
