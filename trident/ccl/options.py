"""A collective call's options, checked at plan build before anything can skip them.

`knobs` checks the launch overrides (block, programs) and the knobs (keyword options an
algorithm takes: warps, pull all_gather's order, relay broadcast's chunk and depth) of the
algorithm a call runs. The algorithms make the same checks when they launch; making them
here as well means that a call which launches no kernel -- one rank, where a collective is
a copy or nothing, or an empty tensor -- rejects a bad option with the same error as a
call that does.
"""
from __future__ import annotations

import inspect

from . import common
from .all_gather.pull import check_knobs as check_pull
from .broadcast.relay import check_knobs as check_relay


def knobs(ctx, op: str, name: str, fn, options: tuple, block=None, programs=None,
          word: int = 1) -> dict:
    """The knobs (`options`: sorted (name, value) pairs beyond block and programs) for
    algorithm `name` (function `fn`) of `op`, checked against what it takes, and their
    values and block/programs checked as the algorithm checks them. `word`: the size in
    bytes of the elements the algorithm moves (relay's chunk counts them). Raises
    ValueError; returns the knobs as a dict."""
    if name == "nccl":
        if options:
            raise ValueError(f"{op}: nccl takes no options, got {dict(options)}")
        return {}
    kw = dict(options)
    if kw:
        params = inspect.signature(fn).parameters
        takes = [p for p in params if params[p].kind == params[p].KEYWORD_ONLY
                 or p not in ("ctx", "plan") and params[p].default is not params[p].empty]
        bad = [k for k in kw if k not in takes or k in ("block", "programs")]
        if bad:
            raise ValueError(f"{op} {name}: unknown option(s) {bad}; it takes "
                             f"{[p for p in takes if p not in ('block', 'programs')]}")
    common.check_launch(block, programs)
    common.check_warps(kw.get("warps"))
    if (op, name) == ("all_gather", "pull"):
        check_pull(kw.get("order", "peer"))
    elif (op, name) == ("broadcast", "relay"):
        check_relay(ctx, word, block, kw.get("chunk"), kw.get("depth"))
    return kw
