"""ExpertParallel's dispatch and combine as torch custom ops (no autograd), found by
ep.name (trident/moe/expert_parallel.py)."""
from __future__ import annotations

from typing import Optional

import torch

from .common import LIB as _LIB, expert_parallel


@torch.library.custom_op(_LIB + "moe_dispatch", mutates_args=())
def moe_dispatch(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: Optional[torch.Tensor],
                 ep: str) -> tuple[torch.Tensor, torch.Tensor]:
    """ExpertParallel.dispatch as an op. The outputs are copies of the object's buffers
    (an op's outputs must be its own; the buffers are overwritten by the next dispatch)."""
    d = expert_parallel(ep).dispatch(x, topk_idx, topk_weights=topk_weights)
    return d.expert_x.clone(), d.expert_num_tokens.clone()


@moe_dispatch.register_fake
def _(x, topk_idx, topk_weights, ep):
    e = expert_parallel(ep)
    return (x.new_empty(e.num_local_experts, e.capacity, e.hidden_dim),
            x.new_empty(e.num_local_experts, dtype=torch.int32))


@torch.library.custom_op(_LIB + "moe_combine", mutates_args=())
def moe_combine(expert_y: torch.Tensor, topk_weights: Optional[torch.Tensor], ep: str,
                num_tokens: int) -> torch.Tensor:
    """ExpertParallel.combine of the object's latest dispatch (num_tokens: its T)."""
    e = expert_parallel(ep)
    d = e._result
    if d is None or d.num_tokens != num_tokens:
        raise ValueError(f"trident::moe_combine: the latest dispatch of {ep!r} had "
                         f"{None if d is None else d.num_tokens} tokens, not {num_tokens}")
    return e.combine(expert_y, d, topk_weights)


@moe_combine.register_fake
def _(expert_y, topk_weights, ep, num_tokens):
    return expert_y.new_empty(num_tokens, expert_parallel(ep).hidden_dim)
