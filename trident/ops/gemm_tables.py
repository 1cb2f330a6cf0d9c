"""The GEMM core's configs per shape class, one table per GPU model, in JSON files beside
this module: gemm_table.json (the candidates' list and the H200's table) and one file per
other measured model, gemm_table_<model>.json (gemm_table_h100.json: the H100's), each

    {"about": ..., "candidates": {name: config, ...},
     "gpus": {"NVIDIA H200": {"capability": [9, 0], "m_edges": [...], "n_edges": [...],
                              "k_edges": [...], "about": ..., "classes": {cls: entry}}}}

The package's tables are all of them together (`read()`). A GPU model's table is what
`python -m trident.bench.gemm --update-table PATH` measured on it; a model nobody measured
has no table. Each table carries its own class edges (the measurements define its
buckets; tables written now have M_EDGES: one bucket per benchmark M, decode sizes 1,
8, 16 and 32 included; older tables had other edges: docs/history.md, "Notes moved out of the source"). A class entry names a candidate ("config") and, where
that config is swap-AB (trident/ops/gemm_configs.py), the best measured plain one
("fused_config").

Which table a GPU uses (`lookup`): the one `trident tune --gemm` measured on this GPU
model, from the user's cache (`tuned_path`: $TRIDENT_CACHE_DIR/tune/gemm-table-<model>.json,
beside the collectives' tuned tables, trident/ccl/tune_cache.py), else the package's
(`pick`): its own (same name: an H100 takes gemm_table_h100.json's, an H200
gemm_table.json's), else one of the same family (the model token: "H100" of "NVIDIA H100
80GB HBM3" and of "NVIDIA H100 PCIe"), else one of the same compute capability (an H100
without a table of its own takes the H200's), else the nearest capability (the same major
version first); ties go to the first name in sorted order. A class missing from the chosen
table takes the nearest measured M bucket of the same N and K buckets (then the caller's
default).
"""
from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass, field

from ..ccl import tune_cache

TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemm_table.json")

# The buckets of tables written now: one M bucket per benchmark M (1, 8, 16, 32, 64, 128,
# 256, 1024, 4096, 8192 = "mbig"); a value above the last edge is "big".
M_EDGES = (1, 8, 16, 32, 64, 128, 256, 1024, 4096)
N_EDGES = (4096,)
K_EDGES = (4096,)


def _bucket(x: int, edges, letter: str) -> str:
    for e in edges:
        if x <= e:
            return f"{letter}{e}"
    return f"{letter}big"


def _buckets(edges, letter: str) -> list[str]:
    return [*(f"{letter}{e}" for e in edges), f"{letter}big"]


@dataclass
class GpuTable:
    """One GPU model's table: its class edges and class -> entry ({"config": name or
    dict, "fused_config": name (optional), "measured": bool, notes...})."""
    name: str
    capability: tuple | None = None
    m_edges: tuple = M_EDGES
    n_edges: tuple = N_EDGES
    k_edges: tuple = K_EDGES
    classes: dict = field(default_factory=dict)
    about: str = ""

    def shape_class(self, M: int, N: int, K: int) -> str:
        """e.g. "m256-nbig-k4096": M <= 256 (and above the edge below), N > 4096, K <= 4096."""
        return (f"{_bucket(M, self.m_edges, 'm')}-{_bucket(N, self.n_edges, 'n')}-"
                f"{_bucket(K, self.k_edges, 'k')}")

    def all_classes(self) -> list[str]:
        return [f"{m}-{n}-{k}" for m in _buckets(self.m_edges, "m")
                for n in _buckets(self.n_edges, "n") for k in _buckets(self.k_edges, "k")]

    def entry(self, M: int, N: int, K: int) -> dict | None:
        """The class entry of a problem; for a class the table lacks, the one of the
        nearest M bucket with the same N and K buckets (None when there is none)."""
        cls = self.shape_class(M, N, K)
        if cls in self.classes:
            return self.classes[cls]
        ms = _buckets(self.m_edges, "m")
        here = ms.index(cls.split("-", 1)[0])
        rest = cls.split("-", 1)[1]
        for i in sorted(range(len(ms)), key=lambda i: (abs(i - here), i)):
            if f"{ms[i]}-{rest}" in self.classes:
                return self.classes[f"{ms[i]}-{rest}"]
        return None

    def to_json(self) -> dict:
        return {"capability": list(self.capability) if self.capability else None,
                "m_edges": list(self.m_edges), "n_edges": list(self.n_edges),
                "k_edges": list(self.k_edges), "about": self.about, "classes": self.classes}

    @classmethod
    def from_json(cls, name: str, data: dict) -> "GpuTable":
        cap = data.get("capability")
        return cls(name, tuple(cap) if cap else None,
                   tuple(data.get("m_edges", M_EDGES)), tuple(data.get("n_edges", N_EDGES)),
                   tuple(data.get("k_edges", K_EDGES)), dict(data.get("classes", {})),
                   data.get("about", ""))


def shape_class(M: int, N: int, K: int) -> str:
    """The class of a problem in a table written now (M_EDGES, N_EDGES, K_EDGES)."""
    return GpuTable("").shape_class(M, N, K)


def package_files() -> list[str]:
    """The package's table files: gemm_table.json, then gemm_table_<model>.json by name."""
    here = os.path.dirname(TABLE_PATH)
    return [TABLE_PATH] + sorted(glob.glob(os.path.join(here, "gemm_table_*.json")))


def file_for(name: str) -> str:
    """Where the package keeps the table of GPU model `name`: gemm_table_<model>.json
    beside gemm_table.json ("NVIDIA H100 80GB HBM3" -> gemm_table_h100.json)."""
    return os.path.join(os.path.dirname(TABLE_PATH),
                        f"gemm_table_{family(name).lower().replace(' ', '_')}.json")


def file_at(path: str, name: str) -> str:
    """The table file of GPU model `name` that a writer given `path` writes: `path` itself,
    or in a folder its file_for name (`bench gemm --update-table PATH`)."""
    return os.path.join(path, os.path.basename(file_for(name))) if os.path.isdir(path) else path


def read(path: str | None = None) -> tuple[dict, dict]:
    """(candidates listed, {GPU name: GpuTable}) of the table file `path`, or of every
    package file together (path None: `package_files`); ({}, {}) for a missing file. A
    file of the single-table format before tables were keyed by GPU ("classes" at the top,
    M edges 128/512/2048) reads as the table of the device its entries name."""
    if path is None:
        listed, tables = {}, {}
        for f in package_files():
            more, found = read(f)
            listed.update(more)
            tables.update(found)
        return listed, tables
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}, {}
    if "gpus" not in data and "classes" in data:
        devices = {e.get("device") for e in data["classes"].values() if e.get("device")}
        name = sorted(devices)[0] if devices else "unknown"
        data = {"candidates": data.get("candidates", {}), "gpus": {name: dict(
            m_edges=[128, 512, 2048], classes=data["classes"], about=data.get("about", ""))}}
    tables = {name: GpuTable.from_json(name, t) for name, t in data.get("gpus", {}).items()}
    return dict(data.get("candidates", {})), tables


def family(name: str) -> str:
    """The model token of a device name: "NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA GH200
    480GB" -> "GH200"; the whole name when it has none."""
    found = re.search(r"\b([A-Z]+\d{2,}[A-Z]?)\b", name.replace("NVIDIA", ""))
    return found.group(1) if found else name


def pick(tables: dict, name: str, capability: tuple | None = None) -> GpuTable | None:
    """The table a GPU uses: its own, same family, same capability, nearest capability
    (same major first; ties: first name in sorted order); None when there are no tables."""
    if name in tables:
        return tables[name]
    names = sorted(tables)
    same = [n for n in names if family(n) == family(name)]
    if same:
        return tables[same[0]]
    if capability is not None:
        def distance(n):                # the same architecture (major) first
            cap = tables[n].capability
            return (abs(cap[0] - capability[0]), abs(cap[1] - capability[1])) if cap \
                else (1 << 30, 0)
        return tables[min(names, key=lambda n: (distance(n), n))] if names else None
    return tables[names[0]] if names else None


def tuned_path(name: str) -> str:
    """Where `trident tune --gemm` keeps the table it measured on the GPU model `name`:
    gemm-table-<model>.json in the collectives' tuned-table folder (tune_cache.tune_dir)."""
    return os.path.join(tune_cache.tune_dir(), f"gemm-table-{tune_cache.slug(name)}.json")


def _inline_configs(table: GpuTable, listed: dict) -> GpuTable:
    """`table` with the config names its entries give replaced by the configs `listed`
    holds for them: a tuned file runs the tiles it measured, whatever the package's
    candidates are called later."""
    classes = {cls: {key: listed.get(v, v) if key in ("config", "fused_config")
                     and isinstance(v, str) else v for key, v in entry.items()}
               for cls, entry in table.classes.items()}
    return GpuTable(table.name, table.capability, table.m_edges, table.n_edges,
                    table.k_edges, classes, table.about)


def lookup(name: str, capability: tuple | None = None,
           path: str | None = None) -> tuple[GpuTable | None, str]:
    """(the table the GPU model `name` uses, where it comes from, in words): the tuned one
    of this exact model in the user's cache, else the package's (every package file, or
    the file `path`) through `pick`.
    An unreadable tuned file is passed over, and the words say so."""
    tuned, note = tuned_path(name), ""
    try:
        listed, tables = read(tuned)
        if name in tables:
            return _inline_configs(tables[name], listed), f"tuned on this machine: {tuned}"
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        note = f" (passed over the unreadable tuned file {tuned}: {type(exc).__name__})"
    table = pick(read(path)[1], name, capability)
    if table is None:
        return None, "none: the GEMM core's default tiles" + note
    if table.name == name:
        return table, f"the package's table for {name}" + note
    why = ("same model family" if family(table.name) == family(name) else
           "no compute capability known: the first model" if capability is None else
           "same compute capability" if table.capability == tuple(capability) else
           "nearest compute capability")
    return table, (f"the package's table for {table.name}, the nearest measured model to "
                   f"{name} ({why}; `trident tune --gemm` measures this one)" + note)


def update(path: str, table: GpuTable, candidates: dict, about: str,
           keep_others: bool = True) -> str:
    """Write `table` as its GPU's entry of the file at `path`, keeping the other GPUs'
    tables that file holds (and the candidates it lists, which they may name). A new file
    (or keep_others=False: a tuned file, where `lookup` reads only its own model's table)
    holds `table` alone, with the package's candidates and `candidates`: the file of one
    GPU model (`file_for`), which the package reads beside the others."""
    if keep_others and os.path.exists(path):
        listed, tables = read(path)
    else:
        listed, tables = read()[0], {}
    tables[table.name] = table
    data = {"about": about, "candidates": {**listed, **candidates},
            "gpus": {name: tables[name].to_json() for name in sorted(tables)}}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"          # a process reading the file sees all or nothing
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path
