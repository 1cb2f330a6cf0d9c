"""`trident info | demo | bench SUITE | tune | trace OP`."""
from __future__ import annotations

import argparse
import importlib
import sys

BENCH_SUITES = ("p2p", "ccl", "ops", "moe", "tp", "gemm")


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
    bench = sub.add_parser("bench", help="benchmarks: " + ", ".join(BENCH_SUITES))
    bench.add_argument("suite", choices=BENCH_SUITES)
    sub.add_parser("tune", help="measure the collectives' algorithm tables (eager and CUDA "
                   "graph) on this machine, or with --gemm the GEMM core's table on its GPU, "
                   "and keep them for trident to use")
    trace = sub.add_parser("trace", help="run one op with tracing on, write a Perfetto trace")
    args, rest = parser.parse_known_args(argv)
    if args.command in ("info", "demo") and rest:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    if args.command == "info":
        from .tools.info import info
        return info()
    if args.command == "demo":
        from .tools.demo import demo
        return demo(args.world_size)
    if args.command == "bench":
        return importlib.import_module(f"trident.bench.{args.suite}").main(rest) or 0
    if args.command == "tune":
        return importlib.import_module("trident.tune").main(rest) or 0
    if args.command == "trace":
        return importlib.import_module("trident.tools.trace").main(rest) or 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
