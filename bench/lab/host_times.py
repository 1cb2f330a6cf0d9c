"""Where an eager call's host microseconds go, stage by stage (issue 39 item 5: eager host
time <= 8 us per collective, <= 10 us per MoE call).

Every stage is timed with time.perf_counter_ns: `--rounds` rounds of `--calls` calls each,
after a warm-up; the figure is the median over rounds of the round's us per call (the
fastest round beside it, in the JSON's "min_us"). Between rounds the rank synchronises
(ctx.sync, not timed), so that launches never back up in the device queue. `net` in the
table is a row less the timing loop's own cost ("baseline: empty function call").

Stages, on each rank:
  all_reduce, 1 KiB bf16, a heap tensor and a plain one, algorithm auto and lamport:
    the whole ctx.all_reduce(t); the layers under it (ccl.all_reduce(ctx, t), then
    ccl._collective(ctx, key, (t,)) with the key made once); tensor_key(t); ctx.capturing();
    building the key tuple; ctx.plans.get(key) and its parts (the error word's read, the
    dict lookup, the LRU move_to_end); plan.run(tensors) alone (the plan found once);
    each step of the plan alone, and in a Launch step: the stream read
    (`self.stream(self.device)`), the hook check and the C launch itself
    (`launch.fast(*grid, stream, *tail)`); a CUDA-graph replay where the plan became one.
  MoE (DeepSeek-V3's experts, top-k and hidden size on GPUs at 128 tokens; tiny shapes on
    the CPU emulation): ep.dispatch(x, idx) and ep.combine(expert_y, d, w) (out=None and
    out given), and their stages the same way (keys, lookups, the run alone, the output's
    allocation, the Dispatched, ctx.after_op).
  baselines: an empty Python function call (the loop's cost), torch.empty(0), t.add_(1) on
    a tiny tensor of the device, and a trivial Triton kernel launched by kernel[grid](...),
    through its compiled launcher's C entry directly, and through a trident Launch.

On the CPU emulation there is no C launch: each plan's Launch gets a stand-in for it (a
builtin that ignores its arguments, ''.format) so that the Python around it is timed as on
a GPU; rows that need CUDA say "n/a (cpu)". At world 1 an all_reduce has nothing to move:
its plan has no step, so its rows are the Python of the call alone; the launch rows of a
collective need --world 2 (ranks share one GPU under MPS where there is one), and the
trivial kernel's rows give the launch's cost at any world size.

    PYTHONPATH=. python bench/lab/host_times.py [--world 1] [--calls 2000] [--rounds 7]
        [--only all_reduce|moe|baseline] [--json out.json] [--backend cpu]
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

import trident as td

NA = "n/a (cpu)"
MOE_GPU = (256, 8, 7168, 128)      # experts, top-k, hidden, tokens: DeepSeek-V3, 128 tokens
MOE_CPU = (4, 2, 64, 4)            # per rank of the world: experts scale with it


@triton.jit
def _trivial_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def _empty():
    return None


class Timer:
    """Times fn(*args) as `rounds` rounds of `calls` calls (module docstring)."""

    def __init__(self, ctx, calls: int, rounds: int, warmup: int):
        self.ctx, self.calls, self.rounds, self.warmup = ctx, calls, rounds, warmup
        self.median: dict = {}
        self.min: dict = {}

    def __call__(self, name: str, fn, *args) -> None:
        clock, calls = time.perf_counter_ns, range(self.calls)
        for _ in range(self.warmup):
            fn(*args)
        per_call = []
        for _ in range(self.rounds):
            self.ctx.sync()
            t0 = clock()
            for _ in calls:
                fn(*args)
            per_call.append((clock() - t0) / self.calls / 1e3)
        self.ctx.sync()
        self.median[name] = statistics.median(per_call)
        self.min[name] = min(per_call)

    def na(self, name: str) -> None:
        self.median[name] = self.min[name] = NA


# ---------------------------------------------------------------------------- stand-in
class StandIns:
    """On the CPU emulation: give every Launch of the context's plans a stand-in for the C
    launcher, so that Launch.__call__'s hot path (the stream read, the hook check, the
    argument unpacking) runs as on a GPU around a builtin that ignores its arguments.
    undo() puts the Launches back."""

    def __init__(self):
        self.saved = []

    def launch(self, launch) -> None:
        import triton.knobs
        if launch.fast is not None:
            return
        fields = ("fast", "direct", "one_live", "grid", "device", "stream", "hooks",
                  "prefix", "packed", "tail", "head", "rest")
        self.saved.append((launch, {f: getattr(launch, f, None) for f in fields}))
        packed = tuple(range(len(launch.kernel.arg_names)))
        launch.fast, launch.device, launch.stream = "".format, 0, int
        launch.hooks = triton.knobs.runtime
        launch.prefix = (0, 0, 0, None, None, 0, None, None, None)
        launch.packed, launch.tail = packed, launch.prefix + packed
        launch.direct = not launch.live
        if len(launch.live) == 1:
            pos, launch.one_live = launch.live[0]
            launch.head, launch.rest = launch.prefix + packed[:pos], packed[pos + 1:]

    def plans(self, ctx) -> None:
        from trident.runtime.triton_launch import Launch
        for plan in list(ctx.plans._plans.values()):
            for step in plan.steps:
                if isinstance(step, Launch):
                    self.launch(step)

    def undo(self) -> None:
        for launch, fields in self.saved:
            for f, v in fields.items():
                setattr(launch, f, v)
        self.saved.clear()


def _step_name(i: int, step) -> str:
    from trident.runtime.triton_launch import Launch
    if isinstance(step, Launch):
        return f"step {i}: launch {step.kernel.fn.__name__}"
    return f"step {i}: {getattr(step, '__qualname__', type(step).__name__)}"


def _launch_stages(timer: Timer, prefix: str, launch, tensors: tuple, cpu: bool) -> None:
    """A Launch step's parts: the stream read, the hook check, the C launch alone."""
    timer(f"{prefix} . self.stream(self.device)", launch.stream, launch.device)
    timer(f"{prefix} . hooks.launch_enter_hook.calls",
          lambda: launch.hooks.launch_enter_hook.calls)
    grid = launch.grid
    if launch.direct:
        name = f"{prefix} . C launch fast(*grid, stream, *tail)"
        if cpu:
            return timer.na(name)
        stream, tail = launch.stream(launch.device), launch.tail
        timer(name, lambda: launch.fast(*grid, stream, *tail))
    elif launch.one_live is not None:
        name = f"{prefix} . C launch fast(*grid, stream, *head, ptr, *rest)"
        if cpu:
            return timer.na(name)
        stream, head, rest = launch.stream(launch.device), launch.head, launch.rest
        ptr = tensors[launch.one_live].data_ptr()
        timer(name, lambda: launch.fast(*grid, stream, *head, ptr, *rest))
    else:
        timer.na(f"{prefix} . C launch (slower path: live arguments or scratch)")


def _plan_stages(timer: Timer, prefix: str, plan, tensors: tuple, cpu: bool) -> None:
    """plan.run alone, then each of its steps alone (a Launch in its parts)."""
    from trident.runtime.triton_launch import Launch
    timer(f"{prefix} plan.run(tensors)", plan.run, tensors)
    if plan.graph is not None:
        timer(f"{prefix} . graph.replay()", plan.graph.replay)
    for i, step in enumerate(plan.steps):
        name = f"{prefix} . {_step_name(i, step)}"
        timer(name, step, tensors)
        if isinstance(step, Launch):
            _launch_stages(timer, name, step, tensors, cpu)


# ---------------------------------------------------------------------------- all_reduce
def _lru_step(plans, key, plan) -> tuple:
    """What PlanCache.get does to keep its order at a hit: an OrderedDict's move_to_end
    (before the stamps), or the stamp on the plan."""
    if hasattr(plans._plans, "move_to_end"):
        return (plans._plans.move_to_end, key)

    def stamp():
        plan.used = plans.hits + 1
    return (stamp,)


def _all_reduce(ctx, timer: Timer, stand_ins, cpu: bool) -> dict:
    from trident import ccl
    from trident.runtime.plans import tensor_key
    plans, info = ctx.plans, {}
    n = 512                                          # 1 KiB of bf16
    for memory in ("heap", "plain"):
        t = ctx.zeros(n, dtype=torch.bfloat16) if memory == "heap" else \
            torch.zeros(n, dtype=torch.bfloat16, device=ctx.device)
        for alg in ("auto", "lamport"):
            p = f"all_reduce 1KiB bf16 {memory} {alg}:"
            opts = {} if alg == "auto" else {"algorithm": "lamport"}
            for _ in range(3):                       # the plan (and graph) built
                ctx.all_reduce(t, **opts)
            ctx.sync()
            if stand_ins is not None:
                stand_ins.plans(ctx)
            key = ("all_reduce", tensor_key(t), "sum", alg, None, None, (), ctx.capturing())
            plan = plans.get(key)
            assert plan is not None, f"{p} no plan under the key that ccl.all_reduce makes"
            info[p] = {"algorithm": plan.name, "steps": [_step_name(i, s) for i, s
                                                         in enumerate(plan.steps)],
                       "graph": plan.graph is not None}
            timer(f"{p} ctx.all_reduce(t)", lambda: ctx.all_reduce(t, **opts))
            if memory == "plain":
                # a plain tensor at another address each call (64 in turn, apart from the
                # build call's): the plan of its plain key (ccl._plain_key), no build
                fresh = [t.clone() for _ in range(64)]
                for f in fresh:
                    ctx.all_reduce(f, **opts)
                ctx.sync()
                if stand_ins is not None:
                    stand_ins.plans(ctx)
                turn = itertools.cycle(fresh).__next__
                timer(f"{p} ctx.all_reduce(t), t at a new address", lambda: ctx.all_reduce(
                    turn(), **opts))
            timer(f"{p} . ccl.all_reduce(ctx, t)", lambda: ccl.all_reduce(ctx, t, **opts))
            timer(f"{p} . ccl._collective(ctx, key, (t,))", ccl._collective, ctx, key, (t,))
            timer(f"{p} . tensor_key(t)", tensor_key, t)
            timer(f"{p} . ctx.capturing()", ctx.capturing)
            tk, cap, kw = tensor_key(t), ctx.capturing(), {}
            timer(f"{p} . key tuple", lambda: ("all_reduce", tk, "sum", alg, None, None,
                                               tuple(sorted(kw.items())) if kw else (), cap))
            timer(f"{p} . ctx.plans.get(key)", plans.get, key)
            timer(f"{p} . . error word read", lambda: plans.error_word[0])
            timer(f"{p} . . dict lookup", plans._plans.get, key)
            timer(f"{p} . . LRU bookkeeping", *_lru_step(plans, key, plan))
            timer(f"{p} . ctx.debug", lambda: ctx.debug)
            _plan_stages(timer, f"{p} .", plan, (t,), cpu)
    return info


# ---------------------------------------------------------------------------- MoE
def _moe(ctx, timer: Timer, stand_ins, cpu: bool) -> dict:
    from bench.lab.kernel_times import moe_inputs
    from trident.moe.expert_parallel import Dispatched
    from trident.runtime.plans import live_key, tensor_key
    experts, k, hidden, tokens = MOE_CPU if cpu else MOE_GPU
    if cpu:
        experts *= ctx.world_size
    g = torch.Generator().manual_seed(7 + ctx.rank)
    ep, x, idx, w, y = moe_inputs(ctx, g, experts, k, hidden, tokens)
    plans = ctx.plans
    for _ in range(2):                               # every plan built
        d = ep.dispatch(x, idx)
        ep.combine(d.expert_x, d, w)
        ep.combine(d.expert_x, d, w, out=y)
    ctx.sync()
    if stand_ins is not None:
        stand_ins.plans(ctx)
    p = f"moe dispatch {tokens} tokens:"
    cap, check = ctx.capturing(), ep.validate
    key = ("moe_dispatch", ep._id, tensor_key(x), tensor_key(idx), None, True, check, cap,
           False)
    plan = plans.get(key)
    assert plan is not None, f"{p} no plan under the key that ep.dispatch makes"
    timer(f"{p} ep.dispatch(x, idx)", ep.dispatch, x, idx)
    timer(f"{p} . tensor_key(x)", tensor_key, x)
    timer(f"{p} . ctx.capturing()", ctx.capturing)
    tx, ti = tensor_key(x), tensor_key(idx)
    timer(f"{p} . key tuple", lambda: ("moe_dispatch", ep._id, tx, ti, None, True, check,
                                       cap, False))
    timer(f"{p} . ctx.plans.get(key)", plans.get, key)
    b, seq = ep.buf, ep._seq
    timer(f"{p} . Dispatched(...)", Dispatched, b.expert_x, b.expert_num_tokens, tokens,
          False, seq)
    timer(f"{p} . ctx.after_op()", ctx.after_op)
    _plan_stages(timer, f"{p} .", plan, (), cpu)

    d = ep.dispatch(x, idx)
    ey = d.expert_x
    for out, label in ((None, "out=None"), (y, "out given")):
        p = f"moe combine {tokens} tokens {label}:"
        key = ("moe_combine", ep._id, tensor_key(ey), tensor_key(w), tokens, False,
               None if out is None else live_key(out), True, cap)
        plan = plans.get(key)
        assert plan is not None, f"{p} no plan under the key that ep.combine makes"
        timer(f"{p} ep.combine(expert_y, d, w)", ep.combine, ey, d, w, True, out)
        timer(f"{p} . tensor_key(expert_y)", tensor_key, ey)
        if out is not None:
            timer(f"{p} . live_key(out)", live_key, out)
        tey, tw, lo = tensor_key(ey), tensor_key(w), None if out is None else live_key(out)
        timer(f"{p} . key tuple", lambda: ("moe_combine", ep._id, tey, tw, tokens, False, lo,
                                           True, cap))
        if out is None:
            dtype, device = torch.bfloat16, ctx.device
            timer(f"{p} . torch.empty(T, H) (the output)",
                  lambda: torch.empty(tokens, hidden, dtype=dtype, device=device))
        timer(f"{p} . ctx.plans.get(key)", plans.get, key)
        timer(f"{p} . ctx.after_op()", ctx.after_op)
        _plan_stages(timer, f"{p} .", plan, (y,), cpu)
    ep.close()
    return {}


# ---------------------------------------------------------------------------- baselines
def _baselines(ctx, timer: Timer, cpu: bool) -> dict:
    from trident.runtime.triton_launch import Launch
    timer("baseline: empty function call", _empty)
    timer("baseline: torch.empty(0)", torch.empty, 0)
    small = torch.zeros(256, device=ctx.device)
    timer(f"baseline: t.add_(1) ({ctx.device.type} tensor of 256)", small.add_, 1)
    names = ("baseline: triton kernel[grid](...) (trivial kernel)",
             "baseline: compiled launcher's C launch (trivial kernel)",
             "baseline: trident Launch.__call__ (trivial kernel)")
    launch = Launch(_trivial_kernel, (1,), (small, small.numel()), {"BLOCK": 256})
    if cpu:
        timer.na(names[0])
        timer.na(names[1])
        stand_in = StandIns()
        stand_in.launch(launch)
        timer(names[2] + " (stand-in C)", launch, ())
        stand_in.undo()
        timer.na("baseline: triton get_current_stream(device)")
        return {}
    kernel = _trivial_kernel[(1,)]
    timer(names[0], lambda: kernel(small, small.numel(), BLOCK=256))
    if launch.fast is None:                          # Triton's internals changed
        timer.na(names[1])
    else:
        grid, stream, tail = launch.grid, launch.stream(launch.device), launch.tail
        timer(names[1], lambda: launch.fast(*grid, stream, *tail))
        timer("baseline: triton get_current_stream(device)", launch.stream, launch.device)
    timer(names[2], launch, ())
    return {}


# ---------------------------------------------------------------------------- the run
GROUPS = {"baseline": _baselines, "all_reduce": _all_reduce, "moe": _moe}


def main(ctx, only=None, calls: int = 2000, rounds: int = 7, warmup: int = 200) -> dict:
    """Run on every rank (all ranks make the same calls: the collectives need them);
    returns this rank's {"stages": name -> median us, "min_us", "info"}."""
    cpu = ctx.backend != "cuda"
    timer = Timer(ctx, calls, rounds, warmup)
    stand_ins = StandIns() if cpu else None
    info = {}
    try:
        for name, group in GROUPS.items():
            if only and name != only:
                continue
            if name == "baseline":
                info.update(group(ctx, timer, cpu))
            else:
                info.update(group(ctx, timer, stand_ins, cpu))
            ctx.barrier()
    finally:
        if stand_ins is not None:
            stand_ins.undo()
        ctx.plans.clear()               # no plan of this run outlives it (stand-ins)
    device = torch.cuda.get_device_name(ctx.device) if not cpu else "cpu (emulation)"
    return {"rank": ctx.rank, "device": device, "stages": timer.median, "min_us": timer.min,
            "info": info}


def table(ranks: list) -> str:
    """Stage, median us per rank and net (less the empty call) of rank 0."""
    names = list(ranks[0]["stages"])
    base = ranks[0]["stages"].get("baseline: empty function call")
    rows = [["stage"] + [f"rank {r['rank']} us" for r in ranks] + ["net us (rank 0)"]]
    for name in names:
        vals = [r["stages"].get(name) for r in ranks]
        cells = [v if isinstance(v, str) else f"{v:.3f}" for v in vals]
        v0 = vals[0]
        net = "" if isinstance(v0, str) or base is None or name.startswith("baseline") \
            else f"{v0 - base:.3f}"
        rows.append([name] + cells + [net])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def run(world: int | None, only=None, calls: int = 2000, rounds: int = 7, warmup: int = 200,
        backend: str | None = None, pool=None) -> dict:
    args = (only, calls, rounds, warmup)
    ranks = pool.run(main, *args) if pool is not None else \
        td.launch(main, world, *args, backend=backend)
    return {"what": "host us per call of each stage: median over rounds (min_us: the "
                    "fastest round); CPU emulation: C launch replaced by a no-op stand-in",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": ranks[0]["device"], "world": len(ranks), "torch": torch.__version__,
            "triton": triton.__version__, "calls": calls, "rounds": rounds, "ranks": ranks}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--only", choices=tuple(GROUPS), default=None)
    p.add_argument("--backend", default=None)
    p.add_argument("--json", default=None, help="write the JSON here (else to stdout)")
    a = p.parse_args()
    result = run(a.world, a.only, a.calls, a.rounds, a.warmup, a.backend)
    print(table(result["ranks"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    else:
        json.dump(result, sys.stdout, indent=1)
        print()
