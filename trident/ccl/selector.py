"""Which algorithm each collective uses, by message size and world size.

Edit TABLE after measuring (`trident bench ccl` prints the crossovers): for each op, a
list of (largest bytes per rank, algorithm) rows, first match wins, None = no limit.
A world size may have its own list; "default" covers the others. "nccl" hands the call
to torch.distributed (the results JSON of the benchmark says when it does).

Bytes per rank: all_reduce and broadcast the tensor, all_gather the input block,
reduce_scatter the output block, all_to_all the input.

The values below are first guesses from the algorithms' costs (one-shot moves
(world-1)*n, two-shot 2*(world-1)/world*n plus a handshake), not yet measured on GPUs.
"""
KiB, MiB = 1 << 10, 1 << 20

TABLE = {
    "all_reduce": {
        2: [(1 * MiB, "one_shot"), (None, "two_shot")],
        "default": [(256 * KiB, "one_shot"), (None, "two_shot")],
    },
    "all_gather": {"default": [(1 * MiB, "push"), (None, "pull")]},
    "reduce_scatter": {"default": [(256 * KiB, "push"), (None, "pull")]},
    "all_to_all": {"default": [(None, "push")]},
    "broadcast": {"default": [(None, "push")]},
}


def select(op: str, nbytes: int, world_size: int, table: dict | None = None) -> str:
    """The algorithm for `op` at `nbytes` per rank on `world_size` ranks."""
    rows = (table or TABLE)[op]
    for limit, name in rows.get(world_size, rows["default"]):
        if limit is None or nbytes <= limit:
            return name
    return rows["default"][-1][1]
