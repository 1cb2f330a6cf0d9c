"""A collective call's options, checked at plan build before anything can skip them.

`knobs` checks the launch overrides (block, programs) and the knobs (keyword options an
algorithm takes: warps, pull all_gather's order, relay broadcast's chunk and depth) of the
algorithm a call runs, as its declaration in registry.py says. The algorithms make the
same checks when they launch; making them here as well means that a call which launches
no kernel -- one rank, where a collective is a copy or nothing, or an empty tensor --
rejects a bad option with the same error as a call that does.
"""
from __future__ import annotations

from . import common, registry


def knobs(ctx, op: str, name: str, options: tuple, block=None, programs=None,
          word: int = 1) -> dict:
    """The knobs (`options`: sorted (name, value) pairs beyond block and programs) for
    algorithm `name` of `op`, checked against what its declaration (registry.py) says it
    takes, and their values and block/programs checked as the algorithm checks them.
    `word`: the size in bytes of the elements the algorithm moves (relay's chunk counts
    them). Raises ValueError; returns the knobs as a dict. An algorithm of engine "torch"
    (nccl) takes no options and no launch sizes (it launches nothing of trident's)."""
    algorithm = registry.get(op, name)
    kw = dict(options)
    if algorithm.engine == "torch":
        if kw:
            raise ValueError(f"{op}: {name} takes no options, got {kw}")
        return {}
    if kw:
        bad = [k for k in kw if k not in algorithm.knobs]
        if bad:
            raise ValueError(f"{op} {name}: unknown option(s) {bad}; it takes "
                             f"{list(algorithm.knobs)} (keyword arguments that are not "
                             f"{op}'s own go to its algorithm, {name!r} here: a misspelt "
                             f"argument of {op} ends up here too)")
    common.check_launch(block, programs, op)
    common.check_warps(kw.get("warps"))
    algorithm.check_options(ctx, word, block, kw)
    return kw
