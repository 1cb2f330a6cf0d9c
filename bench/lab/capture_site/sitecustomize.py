"""Imported at start-up by every Python process whose PYTHONPATH holds this folder (the
test runner and each rank process it starts): trident's plan captures then go through
bench/lab/capture_cost.py's side-stream capture (capture_begin/end) instead of
trident/runtime/plans.py's torch.cuda.graph. For the A/B of docs/latency.md, "Plan graphs":
a GPU test run with each capture, no source change (bench/gpu_one.sh step allgraphs)."""
import trident.runtime.plans as _plans
from bench.lab.capture_cost import side_stream as _side_stream

_plans._capture = _side_stream
