"""bench/host.py `_silence` (host-time rows time trident's Python with every kernel a
no-op, on one rank while the others wait) against the plans' CUDA graphs: a graph made
before (a plain tensor's, per address) must not replay its real kernels while silenced,
none may be captured from the silenced steps, and undo gives each plan back exactly. On
GPUs a replayed per-address graph ran a real all_reduce on rank 0 alone
(tests/torch_dist/test_bench.py timed out). Needs no GPU: stand-in graphs."""
import types

import torch

from trident.bench.host import _silence
from trident.runtime.plans import Plan, PlanCache


class Graph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


def test_silence_covers_graphs_and_undo_restores_them():
    t = torch.zeros(8)
    steps = []
    cache = PlanCache(graphs="multi")
    plain = Plan((t,), "plain", plain=(0,))        # several steps: graphs per address
    for _ in range(2):
        plain.add(lambda tensors=(): steps.append("plain"))
    cache.put("plain", plain, for_capture=False)
    staged = Plan((), "staged")                    # several steps: one graph after a run
    for _ in range(2):
        staged.add(lambda tensors=(): steps.append("staged"))
    cache.put("staged", staged, for_capture=False)
    assert plain.run == plain._by_address and staged.run == staged._until_graph
    graph = Graph()
    at = (t.data_ptr(),)
    plain.at_graphs[at] = graph
    plain.last_at = at
    ctx = types.SimpleNamespace(plans=cache)

    undo = _silence(ctx)
    for _ in range(3):
        plain.run((t,))
        staged.run(())          # past GRAPH_AFTER: would capture (needs CUDA) if allowed
    other = torch.zeros(8)
    plain.run((other,))
    plain.run((other,))         # an address twice in a row: would capture if allowed
    assert graph.replays == 0 and steps == [], steps
    assert staged.graph is None and list(plain.at_graphs) == [at]
    undo()

    assert plain.at_graphs[at] is graph and plain.run == plain._by_address
    assert staged.graph is None and staged.runs == 0 and plain.captures == 0
    assert plain.last_at == at
    plain.run((t,))
    assert graph.replays == 1
    staged.run(())
    assert steps == ["staged", "staged"], steps
