"""The lab's tools, moved out of the package (issue 32): soak (+ soak_reference), sweep,
hierarchical and silent. They import trident (trident.bench's timing and counting helpers)
and are run from the repository root: `PYTHONPATH=. python -m bench.lab.soak --world 2`."""
