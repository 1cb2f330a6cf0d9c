"""The programs behind the command line, built on the whole library.

    info.py            `trident info`: backend, versions, GPUs, NVLink topology, heap size
    demo.py            `trident demo`: remote stores, signals, atomics and the ops, checked
    trace.py           `trident trace OP`: run one op traced, write a Perfetto trace
    ring.py            the traced ring exchange (`trident trace ring`, the tracing tests)

They live here, not in the packages they exercise, because they import across the
layers (ccl, ops, moe, trace, launch): every package below stays a library that imports
only the layers above it (docs/design.md, "Layout"). The benchmarks are in trident/bench;
the lab's tools (scale_plan, trace_overhead among them) in the repository's bench/lab/.
"""
