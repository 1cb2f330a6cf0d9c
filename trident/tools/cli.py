"""`trident info | demo | bench SUITE | tune | trace OP`."""
from __future__ import annotations

import argparse
import importlib
import sys
import textwrap

# what each suite measures (`trident bench --help`); `trident bench SUITE --help` for its options
SUITES = {
    "p2p": "bandwidth from one GPU to all its peers at once: trident's push and pull kernels "
           "against the copy engines",
    "ccl": "the five collectives, every trident algorithm and the selector's choice against "
           "NCCL (gloo on the CPU), by size: eager, CUDA-graph and host time per call",
    "ops": "GEMMs fused with communication (all_gather_matmul, matmul_reduce_scatter, "
           "matmul_all_reduce, matmul_all_reduce_add_rmsnorm) on Llama-sized layers "
           "against NCCL + cuBLAS",
    "moe": "MoE dispatch + combine (DeepSeek-V3, Qwen3 shapes) against torch.distributed's "
           "all_to_all",
    "tp": "a Llama-3-8B tensor-parallel decode step whose all-reduce + residual + RMSNorm is "
          "done by NCCL, torch symmetric memory, trident, and trident's fused kernels (also "
          "with the GEMM before it)",
    "gemm": "trident's GEMM core alone against cuBLAS on one GPU, every config per shape class "
            "(the measurement behind `trident tune --gemm`)",
}
BENCH_SUITES = tuple(SUITES)


def _world_size(text: str) -> int:
    """--world-size: an integer of at least 1 (0 is not "the default": leave it out)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (leave it out for the "
                                         f"default), got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="trident", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="backend, ranks, GPUs, NVLink topology, heap size")
    demo = sub.add_parser("demo", help="ring of remote stores + signals and an atomic counter")
    demo.add_argument("--world-size", type=_world_size, default=None,
                      help="ranks to start (default: one per GPU, or 4 on the CPU)")
    bench = sub.add_parser(
        "bench", help="benchmarks: " + ", ".join(BENCH_SUITES), add_help=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Measure trident against its baseline in the same run.\nResults go "
                    "to --out-dir, by default ./trident-results.\n\nsuites:\n" +
                    "\n".join(textwrap.fill(what, 88, initial_indent=f"  {name:<6} ",
                                             subsequent_indent=" " * 9)
                              for name, what in SUITES.items()),
        epilog="`trident bench SUITE --help` lists a suite's options.")
    bench.add_argument("-h", "--help", action="store_true",
                       help="this text, or with a suite that suite's options")
    bench.add_argument("suite", nargs="?", choices=BENCH_SUITES)
    # tune and trace parse their own options, --help included (trident/tools/tune.py,
    # trident/tools/trace.py): everything after the command goes to them
    sub.add_parser("tune", add_help=False, help="measure the collectives' algorithm tables "
                   "(eager and CUDA graph) on this machine, or with --gemm the GEMM core's "
                   "table on its GPU, or with --ops the fused ops' schedules, and keep them "
                   "for trident to use")
    sub.add_parser("trace", add_help=False,
                   help="run one op with tracing on, write a Perfetto trace")
    args, rest = parser.parse_known_args(argv)
    if args.command in ("info", "demo") and rest:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    if args.command == "info":
        from .info import info
        return info()
    if args.command == "demo":
        from .demo import demo
        return demo(args.world_size)
    if args.command == "bench":
        if args.suite is None:
            if args.help:
                bench.print_help()
                return 0
            bench.error("choose a suite: " + ", ".join(BENCH_SUITES))
        if args.help:
            rest = ["--help", *rest]
        return importlib.import_module(f"trident.bench.{args.suite}").main(rest) or 0
    if args.command == "tune":
        return importlib.import_module("trident.tools.tune").main(rest) or 0
    if args.command == "trace":
        return importlib.import_module("trident.tools.trace").main(rest) or 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
