"""The low-latency round's signal protocol (trident/moe/buffers.py "Low latency"): every
program that sends signals every rank itself, and a receiver waits for all the programs
of one source at once. What that must keep, at worlds 2 and 4 on random data:

  - a rank with no token, and one with a single token of a large batch (most of its send
    programs send nothing and only signal), over many epochs: combines of one dispatch
    repeated (weights with the tokens and with combine), split and fused calls mixed;
  - ranks whose programs would signal in different numbers (another program cap:
    ExpertParallel's num_sms), on either path, raise CallMismatch or PeerFailed on every
    rank, with the outputs poisoned, never rows of a half-signalled source (then
    ctx.reset() on every rank); rounds on fewer SMs are right; a bad num_sms is refused.
"""
import pytest
import torch

import trident as td
from trident.runtime.errors import CallMismatch, PeerFailed

from ..conftest import pool_worlds
from ..faults.test_no_silent_garbage import MEET, _raises_at_once
from .unchecked import arguments_unchecked
from .test_expert_parallel import (_check_combine, _check_dispatch, _round_inputs,
                                   _run_experts)

POOL_WORLDS = pool_worlds([2, 4])


def _epochs(ctx, counts_of, rounds, num_sms=None, high_throughput=False):
    """`rounds` rounds on one ExpertParallel (bf16, H 40, top-2, 7 tokens at most), the
    tokens per rank of round i from counts_of(i, world); every output checked. num_sms:
    ExpertParallel's (fewer programs per launch)."""
    E, k, H, M, dtype = 2 * ctx.world_size, 2, 40, 7, torch.bfloat16
    ep = td.ExpertParallel(ctx, E, k, H, M, dtype=dtype, high_throughput=high_throughput,
                           num_sms=num_sms)
    if num_sms is not None:
        assert ep.sms == num_sms and ep.max_programs == 2 * num_sms, (ep.sms, ep.max_programs)
    L = E // ctx.world_size
    try:
        for i in range(rounds):
            ranks, a, b = _round_inputs(500 + i, ctx.world_size, E, k, H, M, dtype,
                                        counts_of(i, ctx.world_size))
            T, x, idx, w = ranks[ctx.rank]
            x, idx, w = x.to(ctx.device), idx.to(ctx.device), w.to(ctx.device)
            early = i % 3 == 1                     # weights with the tokens
            split = i % 2 == 1
            h = ep.dispatch(x, idx, wait=not split, topk_weights=w if early else None)
            d = h.wait() if split else h
            _check_dispatch(ctx, d, ranks, L)
            ey = _run_experts(ctx, d, L, a, b, dtype)
            for j in range(1 + (i % 4 == 0) * 2):  # combines of one dispatch, repeated
                h = ep.combine(ey, d, None if early else w, wait=not (split and j == 0))
                y = h if isinstance(h, torch.Tensor) else h.wait()
                _check_combine(y, T, x.cpu(), idx.cpu(), w.cpu(), a, b, dtype)
        ctx.barrier()
    finally:
        ep.close()


def _none_on_rank_0(i, world):
    """Rank 0 never has a token; rank 1 one, then all 7, in turn; the others random."""
    g = torch.Generator().manual_seed(i)
    return [0, 1 if i % 2 == 0 else 7] + torch.randint(0, 8, (world - 2,), generator=g).tolist()


def _zero_or_one(i, world):
    """Every rank 0 or 1 token of 7: most send programs signal without sending."""
    return [(i + r) % 2 for r in range(world)]


def test_a_rank_with_no_token_over_many_epochs(pool):
    pool.run(_epochs, _none_on_rank_0, 8)


def test_single_tokens_of_a_large_batch(pool):
    pool.run(_epochs, _zero_or_one, 6)


def test_rounds_on_fewer_sms(pool):
    """num_sms=1: two programs a launch (the emulation's default is 3), both paths."""
    pool.run(_epochs, _none_on_rank_0, 3, 1)
    pool.run(_epochs, _zero_or_one, 2, 1, True)


def _bad_num_sms(ctx):
    out = []
    for bad in (0, -2, True, 1.5, "4"):
        try:
            td.ExpertParallel(ctx, 2 * ctx.world_size, 2, 32, 6, num_sms=bad)
            out.append(None)
        except ValueError as exc:
            out.append(str(exc))
    return out


def test_a_bad_num_sms_is_refused(pool):
    for rank, texts in enumerate(pool.run(_bad_num_sms)):
        assert all(t and "num_sms must be a positive int or None" in t for t in texts), \
            (rank, texts)


def _program_caps_differ(ctx, high_throughput=False):
    """Rank 0 caps its programs lower than the others (num_sms=1: 2 a launch; the others
    the emulation's 3): its dispatch has fewer send programs, so the others would wait
    for signals that never come -- or, the other way round, read a source before all its
    programs signalled."""
    with arguments_unchecked():     # the constructor refuses this (test_misuse.py)
        ep = td.ExpertParallel(ctx, 2 * ctx.world_size, 2, 32, 6, dtype=torch.float32,
                               high_throughput=high_throughput,
                               num_sms=1 if ctx.rank == 0 else None)
    timeout = ctx.timeout_s
    ctx.set_timeout(MEET)
    try:
        ranks, _, _ = _round_inputs(9, ctx.world_size, ep.num_experts, 2, 32, 6,
                                    torch.float32, [6] * ctx.world_size)
        _, x, idx, _ = ranks[ctx.rank]
        d = ep.dispatch(x.to(ctx.device), idx.to(ctx.device))
        kind, text, _ = _raises_at_once(ctx.barrier)
        poisoned = (bool(d.expert_x.isnan().all()) and bool((d.expert_num_tokens == -1).all()))
        ctx.reset()
        return kind, text, poisoned
    finally:
        ctx.set_timeout(timeout)
        ep.close()


@pytest.mark.parametrize("high_throughput", [False, True], ids=["low_latency", "ht"])
def test_program_counts_that_differ_raise_on_every_rank(pool, high_throughput):
    for rank, (kind, text, poisoned) in enumerate(pool.run(_program_caps_differ,
                                                           high_throughput)):
        assert kind in (CallMismatch.__name__, PeerFailed.__name__), (rank, kind, text)
        assert "moe_dispatch" in text, text
        assert poisoned, f"rank {rank}: a dispatch of differing calls left plausible outputs"
