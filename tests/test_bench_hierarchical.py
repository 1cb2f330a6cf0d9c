"""bench/lab/hierarchical.py, briefly, on the CPU emulation at 2 nodes x 2 ranks: the
counts of each warm call against what the code of its path must do (issue 23's target: at
most one extra launch per intra-node step beyond the single-node op), so that this fails
when a path changes. At 1 KiB per rank every node step is one Triton launch. The tensors
are on the heap, so a node step stages nothing; the torch kernels left are the paths' own
reorder copies (and whatever the gloo backend dispatches itself: the flat path's count).
"""
import json

import pytest
import torch

from bench.lab import hierarchical
from trident.nodes.topology import pool_in_nodes

WORLD, NODE = 4, 2
OPTS = dict(ops=list(hierarchical.OPS) + ["moe dispatch", "moe combine"], memory="heap",
            moe=(8, 2, 64, 4), count_calls=1, calls=1, reps=1, warmup=0, silent_calls=50,
            batch=25, out_dir=None)
ALL_REDUCE_N = 301                  # not a multiple of the node size: the padded path


def _all_reduce_after(ctx):
    """Max error of a hierarchical all_reduce of random data, after the bench."""
    x = torch.randn(ALL_REDUCE_N, generator=torch.Generator().manual_seed(ctx.rank))
    got = ctx.all_reduce(x.clone(), algorithm="hierarchical")
    want = sum(torch.randn(ALL_REDUCE_N, generator=torch.Generator().manual_seed(r))
               for r in range(ctx.world_size))
    return float((got - want).abs().max())


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    path = tmp_path_factory.mktemp("hierarchical") / "results.json"
    pool = pool_in_nodes(WORLD, NODE, backend="cpu", heap_size=32 << 20, timeout=60.0,
                         run_timeout=300.0)
    try:
        result = hierarchical.run(WORLD, NODE, {**OPTS, "json": str(path)}, pool=pool)
        errors = pool.run(_all_reduce_after)
    finally:
        pool.close()
    rows = {(r["op"], r["path"]): r for r in result["rows"]}
    return rows, json.loads(path.read_text()), errors


def _per_rank(row, key, which="counts"):
    return [r[which][key] for r in row["per_rank"]]


def test_warm_calls_make_no_sync_no_host_collective_no_build(bench):
    rows, _, _ = bench
    for row in rows.values():
        for which in ("counts", "base"):
            for key in ("host_syncs", "host_collectives", "builds"):
                assert _per_rank(row, key, which) == [0] * WORLD, (row["op"], row["path"],
                                                                    which, key)


def test_hierarchical_all_reduce_is_node_reduce_scatter_rail_all_reduce_node_all_gather(bench):
    row = bench[0][("all_reduce", "hierarchical")]
    assert row["step_names"] == {"reduce_scatter": 1, "all_gather": 1}
    assert row["collective_names"] == {"c10d.allreduce_.default": 1}
    assert _per_rank(row, "collectives") == [1] * WORLD
    assert row["triton_launches"] == 2 and row["torch_kernels"] == 0
    assert row["extra_per_step"] == (2 - row["base_triton_launches"]) / 2


# op -> (node steps, rail collective, the path's own torch copies)
STEPS = {"all_gather": ({"all_gather": 1}, "c10d._allgather_base_.default", 1),
         "reduce_scatter": ({"reduce_scatter": 1}, "c10d._reduce_scatter_base_.default", 1),
         "all_to_all": ({"all_to_all": 1}, "c10d.alltoall_base_.default", 2),
         "broadcast": ({"broadcast": 1}, "c10d.broadcast_.default", 0)}


@pytest.mark.parametrize("op", sorted(STEPS))
def test_hierarchical_collective_counts(bench, op):
    rows = bench[0]
    row, flat = rows[(op, "hierarchical")], rows[(op, "nccl")]
    steps, collective, copies = STEPS[op]
    assert row["step_names"] == steps
    assert row["collective_names"] == {collective: 1}
    assert row["triton_launches"] == 1 == row["launch_objects"]
    # the path's reorder copies, besides what the gloo collective dispatches itself
    assert row["torch_kernels"] == copies + flat["torch_kernels"]
    # the broadcast's rail step runs on the source's rail only (local rank 0)
    on_rail = [1, 0, 1, 0] if op == "broadcast" else [1] * WORLD
    assert _per_rank(row, "collectives") == on_rail


@pytest.mark.parametrize("op", hierarchical.OPS)
def test_flat_path_is_one_collective_and_no_launch(bench, op):
    row = bench[0][(op, "nccl")]
    assert _per_rank(row, "collectives") == [1] * WORLD
    assert _per_rank(row, "triton_launches") == [0] * WORLD
    assert _per_rank(row, "intra_node_steps") == [0] * WORLD
    assert row["extra_per_step"] is None and row["target_met"] is None


def test_moe_across_nodes_counts(bench):
    rows = bench[0]
    d, c = rows[("moe dispatch", "across nodes")], rows[("moe combine", "across nodes")]
    # dispatch: pack_kernel (it marks the unused rows and zeroes its counters itself: no
    # torch op), one rail all_to_all, the node's dispatch (the single-node op's launches)
    assert d["step_names"] == {"dispatch": 1}
    assert d["collective_names"] == {"c10d.alltoall_base_.default": 1}
    assert d["triton_names"]["pack_kernel"] == 1
    assert d["triton_launches"] == d["base_triton_launches"] + 1
    assert d["torch_names"] == {}
    # combine: weights to their rows (one index_put_) and over the rail, the node's
    # combine, the rows back over the rail, their sum at the sender (unpack_kernel)
    assert c["step_names"] == {"combine": 1}
    assert c["collective_names"] == {"c10d.alltoall_base_.default": 2}
    assert c["triton_names"]["unpack_kernel"] == 1
    assert c["triton_launches"] == c["base_triton_launches"] + 1
    assert c["torch_kernels"] == 1, c["torch_names"]


def test_target_met_on_every_rank(bench):
    rows = bench[0]
    for (op, path), row in rows.items():
        if path == "nccl":
            continue
        extras = [(r["counts"]["triton_launches"] - r["base"]["triton_launches"])
                  / r["counts"]["intra_node_steps"] for r in row["per_rank"]]
        assert row["extra_per_step"] == max(extras) <= 1, (op, extras)
        assert row["target_met"] is True


def test_times_and_json(bench):
    rows, saved, errors = bench
    for row in rows.values():
        for prefix in ("", "base_"):
            assert row[prefix + "eager_us"] > 0 and row[prefix + "host_us"] > 0
            assert 0 < row[prefix + "silent_us"] < row[prefix + "eager_us"], row.get("silent_note")
    assert saved["backend"] == "cpu" and saved["layout"] == "2 nodes x 2"
    assert saved["torch"] == torch.__version__ and saved["triton"] and saved["date"]
    assert len(saved["rows"]) == len(rows) == 2 * len(hierarchical.OPS) + 2
    # the silent pass (rank 0 alone) and the reset after it left a usable context
    assert max(errors) < 1e-4
