"""The soak's inputs, which every rank can compute for every rank, and its torch reference.

Inputs. An op's inputs, every rank's in rank order, form one sequence (its "layout"); the
element at place x of it is a mix of TABLE[x] (a fixed 32-bit hash of x, computed once
per device: `table`) and of the op's key, made from the seed and the op's number (a
Python int for eager ops) and, inside CUDA graphs, a replay counter that lives on the
device (then the key is a 0-dim device tensor). So every rank computes any rank's input
with a few integer torch ops on its own device: no communication, no host
synchronisation, and inside a CUDA graph too (each replay bumps the counter and so draws
new data). A place range is a view of the table; a warm eager op costs about ten torch
ops for its input and as many for its reference.

Values: small integers in [-8, 8) for floating-point sums (every order of summation is
exact, in every dtype, up to 32 ranks), integers in [-1000, 1000) for int32, multiples of
2**-20 in [-8, 8) (rounded to the dtype) otherwise. Never NaN: the soak poisons outputs
with NaN, which then cannot pass.

Reference. The output an op must give on a rank, from the inputs of the ranks it reads,
with plain torch ops only (sums over ranks in int64 on the small integers, amax/amin,
slices and cat): no trident kernel and no host collective, so it also runs where NCCL
cannot (ranks that share a GPU).
"""
from __future__ import annotations

import torch

MASK = 0xFFFFFFFF
_TABLES: dict = {}       # device -> TABLE (int64), grown on demand (see `table`)


def hash32(x):
    """A 32-bit integer hash (Thomas Mueller's) of a Python int or of an int64 tensor, of
    values in [0, 2**32). Products stay below 2**59: int64 never overflows."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & MASK
    x = ((x >> 16) ^ x) * 0x45D9F3B & MASK
    return (x >> 16) ^ x


def table(device, places: int) -> torch.Tensor:
    """TABLE[0 ... >= places) on `device`: hash32 of each place. Made (or grown) here, so
    a caller that captures CUDA graphs makes it at its largest first (a capture must not
    allocate it)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:     # one key per GPU
        device = torch.device("cuda", torch.cuda.current_device())
    t = _TABLES.get(device)
    if t is None or t.numel() < places:
        t = _TABLES[device] = hash32(torch.arange(max(places, 1 << 12), dtype=torch.int64,
                                                  device=device))
    return t


def layout_places(world: int, max_numel: int) -> int:
    """Places of the longest layout of a soak of up to max_numel elements per rank: the
    inputs of reduce_scatter, world * n each."""
    return world * world * max_numel


def op_key(seed: int, index: int, replay: torch.Tensor | None = None):
    """The key of op `index` of the soak with `seed`: a Python int (eager ops), or, with
    `replay` (a 0-dim int64 device tensor, bumped by every replay of a CUDA graph), a 0-dim
    device tensor that changes at every replay."""
    h = hash32((seed * 1_000_003 + index) & MASK)
    if replay is None:
        return h
    return (replay * 0x9E3779B1 + h) & MASK


def _mixed(places: torch.Tensor, key) -> torch.Tensor:
    """32-bit values of `places` (a view of the table) under `key`: one xor-multiply-shift
    round on top of the table's hash, so that another key gives other values everywhere."""
    h = (places ^ key).mul_(0x45D9F3B).bitwise_and_(MASK)
    return h.bitwise_xor_(h >> 16)


def values_of(spec: dict, places: torch.Tensor, key, raw: bool = False) -> torch.Tensor:
    """The op's elements at `places`, in its dtype (raw: small-integer sums stay int64,
    which the reference sums exactly before it rounds once)."""
    h = _mixed(places, key)
    dtype = spec["dtype"]
    if not dtype.is_floating_point:
        return h.remainder_(2000).sub_(1000).to(dtype)
    if spec.get("reduce") == "sum":
        h = h.bitwise_and_(15).sub_(8)
        return h if raw else h.to(dtype)
    return h.bitwise_and_(0xFFFFFF).sub_(1 << 23).to(torch.float32).mul_(2.0 ** -20).to(dtype)


def _device(key):
    return key.device if isinstance(key, torch.Tensor) else torch.device("cpu")


def _a2a_offsets(spec: dict, world: int) -> list[int]:
    """Where each rank's all_to_all input starts in the layout (its rows, all columns)."""
    S, c = spec["splits"], spec["cols"]
    return [sum(sum(S[t]) for t in range(s)) * c for s in range(world)]


def _range(device, start: int, count: int) -> torch.Tensor:
    return table(device, start + count)[start:start + count]


def input_of(spec: dict, rank: int, world: int, key, device=None) -> torch.Tensor:
    """Rank `rank`'s input of the op, flat (on `device`, default the key's: give it when
    the key is a Python int)."""
    device = device or _device(key)
    op, n = spec["op"], spec["numel"]
    if op == "reduce_scatter":
        start, count = rank * world * n, world * n
    elif op == "all_to_all":
        start = _a2a_offsets(spec, world)[rank]
        count = sum(spec["splits"][rank]) * spec["cols"]
    else:
        start, count = rank * n, n
    return values_of(spec, _range(device, start, count), key)


def _reduce(v: torch.Tensor, how: str, dtype: torch.dtype) -> torch.Tensor:
    """Reduce [world, n] over the ranks (sums: v is raw int64 small integers, exact)."""
    if how == "sum":
        return v.sum(0).to(dtype)
    return v.amax(0) if how == "max" else v.amin(0)


def expected(spec: dict, rank: int, world: int, key, device=None) -> torch.Tensor:
    """The op's output on rank `rank`, flat, from the inputs of the ranks it reads."""
    device = device or _device(key)
    op, n = spec["op"], spec["numel"]
    if op in ("all_reduce", "reduce_scatter"):
        # all_reduce: every rank's input; reduce_scatter: block `rank` of every rank's input
        start, stride = (0, n) if op == "all_reduce" else (rank * n, world * n)
        t = table(device, start + (world - 1) * stride + n)
        v = values_of(spec, t.as_strided((world, n), (stride, 1), start), key, raw=True)
        return _reduce(v, spec["reduce"], spec["dtype"])
    if op == "all_gather":
        return values_of(spec, _range(device, 0, world * n), key)
    if op == "broadcast":
        return values_of(spec, _range(device, spec["src"] * n, n), key)
    if op == "all_to_all":           # the rows each rank s sends to `rank`, in rank order
        S, c = spec["splits"], spec["cols"]
        starts = _a2a_offsets(spec, world)
        t = table(device, sum(map(sum, S)) * c)
        parts = [(starts[s] + sum(S[s][:rank]) * c, S[s][rank] * c) for s in range(world)]
        parts = [t[a:a + k] for a, k in parts if k]
        places = parts[0] if len(parts) == 1 else torch.cat(parts) if parts else t[:0]
        return values_of(spec, places, key)
    raise ValueError(f"soak reference: unknown op {op!r}")
