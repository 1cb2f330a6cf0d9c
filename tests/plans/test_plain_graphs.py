"""A plan of plain tensors with several steps keeps a CUDA graph per address that came
twice in a row (trident/runtime/plans.py Plan._by_address): new addresses run the steps and
capture nothing, a repeated one is captured once and replayed, at most ADDRESS_GRAPHS are
kept and ADDRESS_CAPTURES made. The capture is stood in for here (the CPU emulation has no
CUDA graphs); on GPUs tests/ccl/test_plain_reuse.py runs the real ones."""
import torch

from trident.runtime import plans
from trident.runtime.plans import ADDRESS_CAPTURES, ADDRESS_GRAPHS, Plan


class FakeGraph:
    def __init__(self, steps, tensors):
        self.at = tensors[0].data_ptr()
        self.replays = 0

    def replay(self):
        self.replays += 1


def _no_cuda(monkeypatch):
    monkeypatch.setattr(plans, "_capture", FakeGraph)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def _plan(ran):
    t = torch.zeros(8)
    plan = Plan(tensors=(t,), name="staged", plain=(0,))
    plan.add(lambda ts: ran.append(("copy in", ts[0].data_ptr())))
    plan.add(lambda ts: ran.append(("kernel", ts[0].data_ptr())))
    return plan.finish("multi")


def test_a_repeated_address_is_captured_once_and_replayed(monkeypatch):
    _no_cuda(monkeypatch)
    ran = []
    plan = _plan(ran)
    assert plan.run == plan._by_address and plan.graph is None
    a, b = torch.ones(8), torch.ones(8)
    plan.run((a,))                      # first time at a: the steps
    assert len(ran) == 2 and not plan.at_graphs
    plan.run((b,))                      # a new address: the steps, no capture
    assert len(ran) == 4 and not plan.at_graphs
    plan.run((b,))                      # b twice in a row: captured, replayed
    plan.run((b,))
    assert len(ran) == 4 and list(plan.at_graphs) == [(b.data_ptr(),)]
    assert plan.at_graphs[(b.data_ptr(),)].replays == 2
    plan.run((a,))                      # back at a: its steps (it never came twice in a row)
    assert len(ran) == 6 and plan.captures == 1


def test_graphs_and_captures_are_bounded(monkeypatch):
    _no_cuda(monkeypatch)
    ran = []
    plan = _plan(ran)
    ts = [torch.ones(8) for _ in range(ADDRESS_CAPTURES + 4)]
    for t in ts:
        plan.run((t,))
        plan.run((t,))
    assert len(plan.at_graphs) == ADDRESS_GRAPHS
    assert plan.captures == ADDRESS_CAPTURES
    kept = [g.at for g in plan.at_graphs.values()]
    assert kept == [t.data_ptr() for t in ts[ADDRESS_CAPTURES - ADDRESS_GRAPHS:ADDRESS_CAPTURES]]
    # past the cap a repeated address runs its steps every time
    before = len(ran)
    plan.run((ts[-1],))
    assert len(ran) == before + 2


def test_a_plan_with_a_step_that_cannot_be_captured_runs_its_steps(monkeypatch):
    monkeypatch.setattr(plans, "_capture", FakeGraph)
    t = torch.zeros(8)
    plan = Plan(tensors=(t,), name="staged", plain=(0,))
    plan.add(lambda ts: None)
    plan.add(lambda ts: None, graphable=False)      # e.g. a call into torch.distributed
    plan.finish("multi")
    assert plan.run != plan._by_address
    one = Plan(tensors=(t,), name="one step", plain=(0,))
    one.add(lambda ts: None)
    one.finish("multi")
    assert one.run != one._by_address            # one launch: nothing to save
    off = _plan([])
    off2 = Plan(tensors=(t,), name="staged", plain=(0,))
    off2.add(lambda ts: None)
    off2.add(lambda ts: None)
    off2.finish("off")
    assert off.run == off._by_address and off2.run != off2._by_address
