"""bench/lab/scale_plan.py: the cost model's predictions past one node, checked
against what the model's formulas imply (no ranks)."""
from math import comb

import pytest

from bench.lab import scale_plan as sp


def test_all_reduce_rows():
    rows = sp.all_reduce_rows([2, 8], sp.H100)
    assert len(rows) == 2 * len(sp.SIZES)
    for r in rows:
        assert r["hierarchical_us"] > 0 and r["flat_us"] > 0
        # the network carries L times fewer bytes on the hierarchical path: it wins at every size
        assert r["hierarchical_us"] < r["flat_us"]
    big = [r for r in rows if r["bytes"] == 1 << 30]
    # bus bandwidth of a GiB: below the per-GPU network rate times L over the rail's share
    assert all(0 < r["busbw_GBps"] < sp.H100["nvlink_gbps"] for r in big)
    assert big[0]["busbw_GBps"] > big[1]["busbw_GBps"]       # more nodes, more rail hops


def test_moe_rows_bytes():
    hw, m = sp.H100, 4
    [bf16, fp8] = [r for r in sp.moe_rows([m], [128], hw) if r["tokens"] == 128]
    E, k, H, L = 256, 8, 7168, hw["gpus"]
    node_hit = 1 - comb(E - E // m, k) / comb(E, k)
    assert bf16["dispatch_net_MB"] == pytest.approx(128 * H * 2 * (m - 1) * node_hit / 1e6)
    assert fp8["dispatch_net_MB"] == pytest.approx(bf16["dispatch_net_MB"] * (1 + 4 / 128) / 2)
    assert fp8["combine_us"] == bf16["combine_us"]              # combine is bf16 in both
    for r in (bf16, fp8):
        assert r["dispatch_capacity_net_MB"] >= r["dispatch_net_MB"]
        assert r["dispatch_overlapped_us"] <= r["dispatch_us"]
        assert r["dispatch_capacity_us"] >= r["dispatch_overlapped_us"]


def test_fixed_capacity_stops_scaling():
    """Routed network bytes per rank level off as nodes grow (a token reaches at most k
    nodes); fixed-capacity buffers grow with the nodes."""
    rows = {r["nodes"]: r for r in sp.moe_rows([8, 32], [4096], sp.H100) if r["dispatch"] == "bf16"}
    routed = rows[32]["dispatch_net_MB"] / rows[8]["dispatch_net_MB"]
    capacity = rows[32]["dispatch_capacity_net_MB"] / rows[8]["dispatch_capacity_net_MB"]
    assert routed < 1.6 and capacity == pytest.approx(31 / 7)


def test_main_prints(capsys):
    assert sp.main(["--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "all_reduce" in out and "1 GiB" in out and "MoE two-stage" in out
