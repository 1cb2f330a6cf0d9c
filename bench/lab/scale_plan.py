"""`PYTHONPATH=. python -m bench.lab.scale_plan`: what the cost model predicts past one node.

Predictions, not measurements (one machine has no network): the numbers docs/nodes.md's
"Scale: past one node" quotes, for M = 2, 4 and 8 nodes of 8 H100s (NVLink 450 GB/s per
GPU one way, 10 us per trident step; a 400 Gb/s NIC per GPU = 50 GB/s, 10 us per network
hop: the issue's figures, overridable with --nvlink-gbps / --net-gbps / --net-us).

- all_reduce, 1 KiB - 1 GiB per rank: trident/nodes/cost.py's two paths (node
  reduce-scatter + rail all-reduce + node all-gather, against one flat collective over
  the world), and the bus bandwidth the better one implies.
- MoE dispatch + combine, DeepSeek-V3 (256 experts, top-8, hidden 7168), 128 and 4096
  tokens per rank, uniform routing, the two-stage scheme of issue 23 item 3: a token
  crosses the network once per remote node that holds any of its experts (to the rank
  of the sender's local index there), which forwards it over NVLink to each rank of its
  node owning one of the token's experts. Dispatch sends bf16 (2 bytes per value) or FP8
  (1 byte + one fp32 scale per 128); combine returns bf16. Time of a half = network
  latency (M - 1 hops, sent at once: one hop's latency) + network bytes / rate, then
  the NVLink step + its bytes / rate; "overlapped" takes the larger of the two stages
  instead of their sum (what a pipelined implementation such as DeepEP's aims at).
  "capacity": the same, overlapped, when the network step moves fixed-size buffers of T
  tokens to every remote node (sizes known on the host without a sync, as issue 23 asks
  of a capturable path) instead of only the tokens routed there.
"""
from __future__ import annotations

import argparse
from math import comb

from trident.nodes import cost

H100 = dict(nvlink_gbps=450.0, nvlink_us=10.0, net_gbps=50.0, net_us=10.0, gpus=8)
SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 26, 1 << 30]
DSV3 = dict(experts=256, topk=8, hidden=7168)
BYTES = {"bf16": 2.0, "fp8": 1.0 + 4.0 / 128}


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def all_reduce_rows(nodes, hw: dict) -> list[dict]:
    """Predicted all_reduce times (us) of both paths and the better one's bus bandwidth."""
    rows = []
    for m in nodes:
        w = m * hw["gpus"]
        for n in SIZES:
            t = cost.predict("all_reduce", n, m, hw["gpus"], inter=(hw["net_gbps"], hw["net_us"]),
                             intra=(hw["nvlink_gbps"], hw["nvlink_us"]))
            best = min(t.values())
            rows.append(dict(nodes=m, gpus=w, bytes=n, hierarchical_us=t["hierarchical"],
                             flat_us=t["nccl"], busbw_GBps=2 * (w - 1) / w * n / best / 1e3))
    return rows


def _miss(experts: int, owned: int, k: int) -> float:
    """P(none of a token's k distinct experts is among `owned` of `experts`)."""
    return comb(experts - owned, k) / comb(experts, k)


def moe_rows(nodes, tokens, hw: dict, model: dict = DSV3) -> list[dict]:
    """Predicted dispatch and combine times (us) of the two-stage scheme."""
    E, k, H, L = model["experts"], model["topk"], model["hidden"], hw["gpus"]
    rows = []
    for m in nodes:
        w = m * L
        node_hit = 1 - _miss(E, E // m, k)            # P(a token needs a given node)
        rank_hit = 1 - _miss(E, E // w, k)            # P(a token needs a given rank)
        remote_nodes = (m - 1) * node_hit              # network copies per token
        # the rank forwards, for its node, the tokens of M senders' rails, to each other
        # rank of the node that owns one of a token's experts
        forwards = m * (L - 1) * rank_hit              # NVLink copies per own token
        for t in tokens:
            for dtype in ("bf16", "fp8"):
                row = dict(nodes=m, gpus=w, tokens=t, dispatch=dtype)
                for half, b in (("dispatch", BYTES[dtype]), ("combine", BYTES["bf16"])):
                    net_b = t * H * b * remote_nodes
                    nvl_b = t * H * b * forwards
                    net = (hw["net_us"] if m > 1 else 0) + net_b / (hw["net_gbps"] * 1e3)
                    nvl = hw["nvlink_us"] + nvl_b / (hw["nvlink_gbps"] * 1e3)
                    row[f"{half}_us"] = net + nvl
                    row[f"{half}_overlapped_us"] = max(net, nvl)
                    row[f"{half}_net_MB"] = net_b / 1e6
                    row[f"{half}_nvlink_MB"] = nvl_b / 1e6
                    # without a host sync the rail exchange has fixed sizes: every remote
                    # node gets a full buffer of T tokens, whatever the routing sent
                    cap_b = t * H * b * (m - 1)
                    row[f"{half}_capacity_net_MB"] = cap_b / 1e6
                    row[f"{half}_capacity_us"] = max(
                        (hw["net_us"] if m > 1 else 0) + cap_b / (hw["net_gbps"] * 1e3), nvl)
                rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lab.scale_plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="2,4,8")
    p.add_argument("--nvlink-gbps", type=float, default=H100["nvlink_gbps"])
    p.add_argument("--net-gbps", type=float, default=H100["net_gbps"])
    p.add_argument("--net-us", type=float, default=H100["net_us"])
    args = p.parse_args(argv)
    nodes = [int(x) for x in args.nodes.split(",")]
    hw = dict(H100, nvlink_gbps=args.nvlink_gbps, net_gbps=args.net_gbps, net_us=args.net_us)
    print(f"all_reduce, {hw['gpus']} GPUs per node (us; busbw of the faster path, GB/s)")
    print(f"{'nodes':>5} {'size':>8} {'hierarchical':>13} {'flat':>10} {'busbw':>7}")
    for r in all_reduce_rows(nodes, hw):
        print(f"{r['nodes']:>5} {_size(r['bytes']):>8} {r['hierarchical_us']:>13.1f} "
              f"{r['flat_us']:>10.1f} {r['busbw_GBps']:>7.1f}")
    print("\nMoE two-stage, DeepSeek-V3 (us: serial / overlapped / fixed capacity; "
          "dispatch MB per rank: network routed / capacity, NVLink)")
    print(f"{'nodes':>5} {'tokens':>6} {'disp':>5} {'dispatch':>26} {'combine':>26} "
          f"{'disp MB net/cap/nvl':>22}")
    for r in moe_rows(nodes, [128, 4096], hw):
        print(f"{r['nodes']:>5} {r['tokens']:>6} {r['dispatch']:>5} "
              f"{r['dispatch_us']:>8.1f} /{r['dispatch_overlapped_us']:>7.1f} /"
              f"{r['dispatch_capacity_us']:>7.1f} "
              f"{r['combine_us']:>8.1f} /{r['combine_overlapped_us']:>7.1f} /"
              f"{r['combine_capacity_us']:>7.1f} "
              f"{r['dispatch_net_MB']:>7.1f}/{r['dispatch_capacity_net_MB']:>6.1f}/"
              f"{r['dispatch_nvlink_MB']:<7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
