"""The soak's inputs, which every rank can compute for every rank, and its torch reference.

Inputs. An op's inputs, every rank's in rank order, form one sequence (its "layout"); the
element at place x of it is a hash of x and of the op's key, a 0-dim device tensor made
from the seed, the op's number and a replay counter that lives on the device. So every
rank computes any rank's input with a few integer torch ops on its own device: no
communication, no host synchronisation, and inside a CUDA graph too (each replay bumps
the counter and so draws new data).

Values: small integers in [-8, 8) for floating-point sums (every order of summation is
exact, in every dtype, up to 32 ranks), integers in [-1000, 1000) for int32, multiples of
2**-20 in [-8, 8) (rounded to the dtype) otherwise. Never NaN: the soak poisons outputs
with NaN, which then cannot pass.

Reference. The output an op must give on a rank, from the inputs of the ranks it reads,
with plain torch ops only (sum over ranks in fp32, amax/amin, slices and cat): no trident
kernel and no host collective, so it also runs where NCCL cannot (ranks that share a GPU).
"""
from __future__ import annotations

import torch

MASK = 0xFFFFFFFF


def hash32(x):
    """A 32-bit integer hash (Thomas Mueller's) of a Python int or of an int64 tensor, of
    values in [0, 2**32). Products stay below 2**59: int64 never overflows."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & MASK
    x = ((x >> 16) ^ x) * 0x45D9F3B & MASK
    return (x >> 16) ^ x


def op_key(seed: int, index: int, replay: torch.Tensor) -> torch.Tensor:
    """The key of op `index` of the soak with `seed`, at the replay count in `replay`
    (a 0-dim int64 device tensor; 0 for eager ops)."""
    return hash32((replay * 0x9E3779B1 + hash32((seed * 1_000_003 + index) & MASK)) & MASK)


def values(spec: dict, key: torch.Tensor, start: int, count: int,
           rows: int = 1, stride: int = 0) -> torch.Tensor:
    """[rows, count] elements of the op's layout: row i holds places
    start + i * stride ... + count - 1."""
    dev = key.device
    x = torch.arange(start, start + count, dtype=torch.int64, device=dev)
    if rows > 1:
        x = torch.arange(rows, dtype=torch.int64, device=dev)[:, None] * stride + x
    h = hash32(x.view(rows, count) ^ key)
    dtype = spec["dtype"]
    if not dtype.is_floating_point:
        return (h % 2000 - 1000).to(dtype)
    if spec.get("reduce") == "sum":
        return (h % 16 - 8).to(dtype)
    return ((h & 0xFFFFFF) - (1 << 23)).to(torch.float32).mul_(2.0 ** -20).to(dtype)


def _a2a_offsets(spec: dict, world: int) -> list[int]:
    """Where each rank's all_to_all input starts in the layout (its rows, all columns)."""
    S, c = spec["splits"], spec["cols"]
    return [sum(sum(S[t]) for t in range(s)) * c for s in range(world)]


def input_of(spec: dict, rank: int, world: int, key: torch.Tensor) -> torch.Tensor:
    """Rank `rank`'s input of the op, flat."""
    op, n = spec["op"], spec["numel"]
    if op == "reduce_scatter":
        return values(spec, key, rank * world * n, world * n).view(-1)
    if op == "all_to_all":
        start = _a2a_offsets(spec, world)[rank]
        return values(spec, key, start, sum(spec["splits"][rank]) * spec["cols"]).view(-1)
    return values(spec, key, rank * n, n).view(-1)


def _reduce(v: torch.Tensor, how: str) -> torch.Tensor:
    """Reduce [world, n] over the ranks."""
    if how == "sum":
        return v.to(torch.float32).sum(0).to(v.dtype)     # small integers: exact
    return v.amax(0) if how == "max" else v.amin(0)


def expected(spec: dict, rank: int, world: int, key: torch.Tensor) -> torch.Tensor:
    """The op's output on rank `rank`, flat, from the inputs of the ranks it reads."""
    op, n = spec["op"], spec["numel"]
    if op == "all_reduce":
        return _reduce(values(spec, key, 0, n, world, n), spec["reduce"])
    if op == "reduce_scatter":       # block `rank` of every rank's input
        return _reduce(values(spec, key, rank * n, n, world, world * n), spec["reduce"])
    if op == "all_gather":
        return values(spec, key, 0, n, world, n).view(-1)
    if op == "broadcast":
        return values(spec, key, spec["src"] * n, n).view(-1)
    if op == "all_to_all":           # the rows each rank s sends to `rank`, in rank order
        S, c = spec["splits"], spec["cols"]
        starts = _a2a_offsets(spec, world)
        return torch.cat([values(spec, key, starts[s] + sum(S[s][:rank]) * c,
                                 S[s][rank] * c).view(-1) for s in range(world)])
    raise ValueError(f"soak reference: unknown op {op!r}")
