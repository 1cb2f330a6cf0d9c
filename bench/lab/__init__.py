"""The lab's tools, moved out of the package (issue 32): soak (+ soak_reference), sweep,
hierarchical, silent, scale_plan (the cost model's predictions past one node) and
trace_overhead (what tracing costs). They import trident (trident.bench's timing and
counting helpers) and are run from the repository root: `PYTHONPATH=. python -m bench.lab.soak --world 2`."""
