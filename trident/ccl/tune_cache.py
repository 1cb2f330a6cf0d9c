"""Where `trident tune` keeps its tables, and which machine a table belongs to.

A table measured on one machine is a guess on another: the crossovers move with the GPU
model, the number of ranks and how the GPUs are linked (NV18 on an H200 board, NV12 or
PCIe elsewhere). So a tuned table is stored under, and only used with, the key
    {"gpu": device name, "world_size": ranks, "topology": hash of the GPU link matrix}
in $TRIDENT_CACHE_DIR/tune/ (default ~/.cache/trident/tune/, or $XDG_CACHE_HOME/trident),
one file per key: <gpu>-w<world>-<topology>.json. (`trident tune --gemm` keeps the GEMM
core's table of a GPU model in the same folder: trident/ops/gemm_tables.tuned_path.)

The link matrix is the GPU-to-GPU part of `nvidia-smi topo -m` (link kinds, not CPU or
NUMA affinity), restricted to CUDA_VISIBLE_DEVICES where that lists indices; without
nvidia-smi, the device names and torch's peer-access matrix. On the CPU emulation the
key is {"gpu": "cpu-emulation", "topology": "none"}.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess

from ..runtime import _env, options

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def tune_dir() -> str:
    base = options.get("TRIDENT_CACHE_DIR") or os.path.join(
        options.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "trident")
    return os.path.join(base, "tune")


def gpu_name() -> str:
    if _env.INTERPRET:
        return "cpu-emulation"
    import torch
    return torch.cuda.get_device_name(torch.cuda.current_device())


def slug(text: str) -> str:
    """A device name as a file name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _file_prefix(gpu: str, world_size: int) -> str:
    return f"{slug(gpu)}-w{world_size}-"


def gpu_links(topo: str) -> list[list[str]]:
    """The GPU-to-GPU link matrix of `nvidia-smi topo -m` output (e.g. [["X", "NV18"],
    ["NV18", "X"]]), restricted to the GPUs CUDA_VISIBLE_DEVICES names by index."""
    lines = [_ANSI.sub("", line) for line in topo.splitlines()]
    header = next((line.split() for line in lines          # the column line is indented
                   if line[:1].isspace() and "GPU0" in line.split()), [])
    n = sum(1 for tok in header if re.fullmatch(r"GPU\d+", tok))
    rows = [line.split()[1:1 + n] for line in lines if re.match(r"GPU\d+\s", line)]
    visible = options.get("CUDA_VISIBLE_DEVICES", "")
    if re.fullmatch(r"\d+(,\d+)*", visible) and rows:
        keep = [int(i) for i in visible.split(",") if int(i) < len(rows)]
        rows = [[rows[i][j] for j in keep] for i in keep]
    return rows


def _topology() -> str:
    if _env.INTERPRET:
        return "none"
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                             timeout=20).stdout
        links: object = gpu_links(out)
    except (OSError, subprocess.SubprocessError):
        links = None
    if not links:
        import torch
        n = torch.cuda.device_count()
        links = [[torch.cuda.get_device_name(i) for i in range(n)],
                 [[i == j or torch.cuda.can_device_access_peer(i, j) for j in range(n)]
                  for i in range(n)]]
    return hashlib.sha1(json.dumps(links).encode()).hexdigest()[:12]


def machine_key(world_size: int) -> dict:
    """The key of this machine's table for `world_size` ranks (see the module docstring)."""
    return {"gpu": gpu_name(), "world_size": int(world_size), "topology": _topology()}


def cache_path(key: dict) -> str:
    return os.path.join(tune_dir(), _file_prefix(key["gpu"], key["world_size"])
                        + f"{key['topology']}.json")


def find(world_size: int) -> tuple[str | None, dict | None]:
    """(path, document) of this machine's tuned table for `world_size`, or (None, None).
    The topology is only hashed when a file for this GPU model and world size exists, so
    a user who never tuned pays nothing. A file whose key differs is ignored."""
    directory, prefix = tune_dir(), _file_prefix(gpu_name(), world_size)
    try:
        if not any(f.startswith(prefix) for f in os.listdir(directory)):
            return None, None
    except OSError:
        return None, None
    key = machine_key(world_size)
    path = cache_path(key)
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None, None
    return (path, doc) if doc.get("key") == key else (None, None)


def write(key: dict, doc: dict, path: str | None = None) -> str:
    """Store `doc` (with its key) as this machine's table; returns the path."""
    path = path or cache_path(key)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({**doc, "key": key}, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path
