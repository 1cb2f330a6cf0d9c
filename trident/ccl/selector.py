"""Which algorithm each collective uses, by message size and world size.

Edit TABLE after measuring (`trident bench ccl` prints the crossovers): for each op, a
list of (largest bytes per rank, algorithm) rows, first match wins, None = no limit.
A world size may have its own list; "default" covers the others. "nccl" hands the call
to torch.distributed (the results JSON of the benchmark says when it does).

Bytes per rank: all_reduce and broadcast the tensor, all_gather the input block,
reduce_scatter the output block, all_to_all the input.

The "default" rows are first guesses from the algorithms' costs (one-shot moves
(world-1)*n, two-shot 2*(world-1)/world*n plus a handshake), not measured on GPUs.
"""
KiB, MiB = 1 << 10, 1 << 20

# World size 4 rows: from bench/results/ccl-4xh200-2026-11-21.json (4x H200, NVLink,
# multicast off). Where trident measured slower than NCCL, or within the run's noise at
# small sizes, the row says "nccl". Other world sizes: unmeasured first guesses.
TABLE = {
    "all_reduce": {
        4: [(256 * KiB, "one_shot"), (None, "nccl")],
        2: [(1 * MiB, "one_shot"), (None, "two_shot")],
        "default": [(256 * KiB, "one_shot"), (None, "two_shot")],
    },
    "all_gather": {4: [(4 * MiB, "nccl"), (None, "pull")],
                   "default": [(1 * MiB, "push"), (None, "pull")]},
    "reduce_scatter": {4: [(None, "nccl")],
                       "default": [(256 * KiB, "push"), (None, "pull")]},
    "all_to_all": {4: [(None, "nccl")], "default": [(None, "push")]},
    "broadcast": {4: [(None, "nccl")], "default": [(None, "push")]},
}


def select(op: str, nbytes: int, world_size: int, table: dict | None = None,
           graph: bool = False) -> str:
    """The algorithm for `op` at `nbytes` per rank on `world_size` ranks (`graph`: the call
    is being captured into a CUDA graph)."""
    rows = (table or TABLE)[op]
    for limit, name in rows.get(world_size, rows["default"]):
        if limit is None or nbytes <= limit:
            return name
    return rows["default"][-1][1]
