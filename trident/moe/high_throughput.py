"""MoE dispatch/combine, the high-throughput path (prefill-size batches; issue 14 item 2).

Why the low-latency kernels (dispatch.py, combine.py) reach only about half the NVLink
floor at 4096 tokens per rank (DeepSeek-V3 shape, 4x H200: dispatch 188 GB/s, combine
143 GB/s, against about 360), read from the code:

  - Senders and receivers are serialised. Dispatch's receive half waits for every rank's
    single "all sent" flag before it copies anything, so the local copy of every received
    token into its expert rows (about 4096 x 3.6 tokens x 14 KB read, twice that written,
    at 4 ranks: ~130 us of HBM time at 4096) starts only after the slowest rank's last
    byte landed. Combine is the same twice over: the receive half (sum of up to `world`
    partials per token, ~70-100 us at 4096) waits for every rank's "partials" flag.
  - Half of the grid moves no data while the senders run. The fused launch is
    min(T, 2 x SMs) senders + 2 x SMs receivers; the receivers spin on the flags and only
    hold SM slots, so 264 programs push (the p2p benchmark needs ~528 for 356 GB/s).
  - Per-token atomics on the critical path: dispatch's sender takes a slot per
    destination from a counter (a vector atomic with a returned value, one L2 round trip
    per token before its first store); the receiver one atomic per (token, local
    expert) for the expert row. Both serialise a program's tokens behind an atomic's
    latency.
  - The copies are 16-byte vectors already (BLOCK_H = 1024 bf16 at 4 warps: 8 per
    thread), one token and one destination at a time: a program has ~2 KB per
    instruction in flight. Destinations are visited in rank order 0..world-1 by every
    program, so at the start all programs feed the same link.
  - Tokens are staged (receive buffer) and copied again into expert_x: that extra copy
    is local HBM (the NVLink bytes are the deduplicated push), kept here, but overlapped
    with the transfer instead of after it.
  - Combine's expert side reads a [KP, BLOCK_H] tile of expert_y per step with only the
    rows of local experts unmasked (~2 of 8 at 4 ranks) and reduces it in fp32: the
    reads are 16-byte and touch only real rows, but each token waits for the weights
    flag of its source before the first one (when weights did not come with dispatch).

What this path changes (same buffers, same outputs, same API):

  - Tokens are cut into chunks of CHUNK_TOKENS (buffers.py). A token keeps its own index
    as its row in every destination's receive buffer (`tokens[par, source, t]`), so the
    sender needs no slot counter and no atomics at all; `send_slot[t, r]` is t or -1.
    The receive buffer has max_num_tokens rows per source anyway.
  - The sender pushes a chunk (the ids to every rank, so a receiver can tell which of
    the chunk's tokens are its own; the payload only to ranks owning one of the token's
    experts), then sets that chunk's flag on every rank to the epoch. Program p visits
    destinations starting at (p + t) % world: at any time the programs spread evenly
    over all links. The token count of the rank goes first, in the dispatch flag
    (epoch << 32 | T), from program 0, so receivers know how many chunks to expect.
  - Receivers take (chunk, source) items in chunk-major order -- the order the senders
    of every rank produce them -- wait for the chunk's flag and copy its tokens into
    their expert rows while later chunks are in flight. Rows of expert_x are reserved
    with one vector atomic per chunk (an add of the chunk's count per distinct local
    expert, positions inside the chunk from a small all-pairs count), not per token.
  - Combine: the expert side walks received chunks in the same order, pushes the partial
    sums of the chunk's tokens that came here (nothing for the others) and sets the
    chunk's flag on the source; the source's receivers sum a chunk of their own tokens
    as soon as every other rank flagged it (one pass, see below).
  - Chunk flags carry the epoch and are never reset: a receiver waits for flag >= its
    epoch; a sender cannot reach epoch e + 1 before this rank finished reading e (each
    launch reads every chunk of every rank before it ends, and every rank flags every
    chunk of every other rank in every epoch), nor e + 2 before this rank's e + 1 send.
    CUDA-graph safe.

Combine, one pass (issue 40). `trident bench moe` at 4096 tokens on 2x H200 had
dispatch 285 us, combine 483 us and combine_wd (weights sent with dispatch) 338 us, from
the code: per token t of rank R (d ranks own some of its k experts, k_r of them on rank
r; a row is H values, 14 KiB at DeepSeek-V3), the staged combine's expert side on every r
of the d, R included, read k_r expert_y rows and wrote one row into R's `partial` (over
NVLink, or local HBM where r = R), one flag per (chunk, source) item, and before each
item polled the source's weights flag again (its sends of a call start only after every
peer's weight programs ran and signalled: successive calls do not overlap across ranks,
the likely part of the 145 us between combine and combine_wd); then R's receivers read
all d partial rows back from HBM and wrote y[t]. So R's own share went through HBM twice
more (a row written, the same row read: 2 of the ~9 rows of local traffic per token at
2 ranks) and 1/world of the expert programs' items (half at 2 ranks) wrote locally
instead of feeding a link, each item of k_r rows read per row sent. Dispatch, for
comparison: per token one x row read (again from L2 per destination), d rows pushed,
one fence per chunk for all ranks, no waits and no atomics on the send side; its
receivers one row read and k_r written per token. Both move 16-byte vectors (BLOCK_H =
1024 bf16 per step at 4 warps), one row per step in flight in dispatch's programs, k_r
in combine's expert programs, d in its receivers; neither sums in a second pass beyond
the staging above.

Now, in the fused launch (PART BOTH), the expert side pushes only to the other ranks
(their chunks spread over the links from rank + 1 on; the weights flag of a source
waited once per program), and R's receivers sum, in one pass per token, the k_R rows of
expert_y here (with the token's own weights) and the partial of each other rank it went
to, each row read once (combine.sum_token: up to KP + WP rows in flight per step), in a
fixed order (deterministic). Split mode keeps the staging: its receive half runs after
the caller may have reused expert_y. PART STAGED is that staging in one launch, for
A/B timing only (plans.HT_COMBINE_STAGED; `trident bench moe --combine-ab`).

Both halves' programs wait only on lower program ids of their own rank (and on other
ranks), so the grid cannot deadlock and the CPU emulation (programs in order) works.
The path is chosen per ExpertParallel (same on every rank): high_throughput=True/False,
or by default max_num_tokens >= ctx.options.moe_ht_min_tokens (TRIDENT_MOE_HT_MIN_TOKENS,
1024: the issue's "prefill size"; to be tuned on GPUs: `trident bench moe` times both
paths at 4096 tokens, rows `trident` and `trident (low-latency)`). Both kernels are
launched with programmatic dependent launch as the low-latency ones are (plans.py `PDL`,
buffers.begin_launch first).
"""
import triton
import triton.language as tl

from .. import language as tdl
from ..trace import device as trd
from ..trace import tags
from . import buffers as B
from .combine import (combine_recv_end, combine_send_begin, push_partial, push_weights,
                      sum_partials, sum_token)
from .dispatch import copy_token, dispatch_recv_begin, dispatch_recv_end, push_payload
from .routing import expert_ids

@triton.jit
def _chunk_flag(chunk_flags, kind: tl.constexpr, source, c, world, max_tokens,
                CHUNK: tl.constexpr):
    return chunk_flags + (kind * world + source) * tl.cdiv(max_tokens, CHUNK) + c


@triton.jit
def ht_dispatch_send(pid, npid, x, stride_x, topk_idx, stride_it, stride_ik, topk_weights,
                     stride_wt, stride_wk, num_tokens, tokens, meta, dweights, flags, fps,
                     chunk_flags, state, send_slot, ctrl, heap_bases, trace_buf, rank,
                     world, max_tokens, experts_per_rank, num_experts, check_ids, fp,
                     H: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, WP: tl.constexpr,
                     HAS_WEIGHTS: tl.constexpr, FP8: tl.constexpr, CHUNK: tl.constexpr,
                     BLOCK_H: tl.constexpr, TRACE: tl.constexpr):
    t0 = trd.begin(TRACE)
    epoch = tdl.launch_epoch(state + B.DISPATCH_SEND_EPOCH)
    par = epoch % 2
    if pid == 0:    # the count first: it says how many chunks every rank must wait for
        B.signal_calls(flags, fps, B.FLAG_DISPATCH, par, world, rank,
                       (epoch << B.COUNT_BITS) | tl.cast(num_tokens, tl.int64), fp,
                       heap_bases, WP)
    ks = tl.arange(0, KP)
    rs = tl.arange(0, WP)
    for c in range(pid, tl.cdiv(num_tokens, CHUNK), npid):
        for t in range(c * CHUNK, tl.minimum(c * CHUNK + CHUNK, num_tokens)):
            e = expert_ids(topk_idx, t, stride_it, stride_ik, num_experts, ctrl, check_ids,
                           K, KP)
            dest = tl.where(e >= 0, e // experts_per_rank, -1)
            hit = tl.max((dest[None, :] == rs[:, None]).to(tl.int32), axis=1)
            tl.store(send_slot + t * WP + rs, tl.where(hit > 0, t, -1))
            row = (par * world + rank).to(tl.int64) * max_tokens + t
            src = x + tl.cast(t, tl.int64) * stride_x
            for j in range(world):
                r = (pid + t + j) % world       # programs spread over the links
                tdl.store(meta + row * KP + ks, e, rank, r, heap_bases)
                if tl.sum(tl.where(rs == r, hit, 0)) > 0:
                    push_payload(src, row, t, r, tokens, dweights, topk_weights, stride_wt,
                                 stride_wk, rank, heap_bases, world, max_tokens, H, K, KP,
                                 HAS_WEIGHTS, FP8, BLOCK_H)
        tdl.signal_ranks(_chunk_flag(chunk_flags, B.CHUNK_DISPATCH, rank, c, world,
                                     max_tokens, CHUNK), epoch, rank, world, heap_bases, WP)
    trd.end(trace_buf, t0, tags.DISPATCH, rank, TRACE)
    if tdl.last_program_out(state + B.DISPATCH_SEND_DONE, npid):
        tl.store(state + B.DISPATCH_SEND_EPOCH, epoch)


@triton.jit
def ht_dispatch_recv(pid, npid, tokens, meta, flags, fps, chunk_flags, state, expert_counter,
                     token_rows, recv_count, expert_x, expert_x_scale, expert_num_tokens,
                     ctrl, heap_bases, trace_buf, rank, world, max_tokens, experts_per_rank,
                     cap, fp, H: tl.constexpr, KP: tl.constexpr, WP: tl.constexpr,
                     FP8: tl.constexpr, CHUNK: tl.constexpr, BLOCK_L: tl.constexpr,
                     BLOCK_H: tl.constexpr, TRACE: tl.constexpr):
    epoch, par, my_flags, ok, t0 = dispatch_recv_begin(flags, fps, state, ctrl, trace_buf,
                                                       rank, world, fp, TRACE)
    rs = tl.arange(0, WP)
    # nothing from a failed call: the last receiver poisons the outputs instead
    counts = (tl.load(my_flags + rs, mask=(rs < world) & ok, other=0, volatile=True)
              & B.COUNT_MASK).to(tl.int32)
    most = tl.cdiv(tl.max(counts), CHUNK)
    first_expert = rank * experts_per_rank
    N: tl.constexpr = CHUNK * KP          # (token, k) entries of a chunk
    js = tl.arange(0, N)
    for item in range(pid, most * world, npid):
        c = item // world                 # chunk-major: the order senders produce them
        s = item % world
        n = tl.sum(tl.where(rs == s, counts, 0))
        if ok & (c * CHUNK < n):
            ok = tdl.wait(_chunk_flag(chunk_flags, B.CHUNK_DISPATCH, s, c, world, max_tokens,
                                      CHUNK), epoch, ctrl, rank, s, B.OP_DISPATCH)
        if ok & (c * CHUNK < n):
            tj = c * CHUNK + js // KP
            valid = tj < n
            base_row = (par * world + s) * max_tokens
            e = tl.load(meta + (base_row + tj) * KP + js % KP, mask=valid, other=-1)
            local = valid & (e >= first_expert) & (e < first_expert + experts_per_rank)
            le = tl.where(local, e - first_expert, -1)
            # same[i, j]: entries i and j go to the same local expert. j's position among
            # the chunk's entries of its expert, and the expert's count in the chunk
            same = (le[:, None] == le[None, :]) & local[:, None] & local[None, :]
            before = tl.sum((same & (js[:, None] < js[None, :])).to(tl.int32), axis=0)
            total = tl.sum(same.to(tl.int32), axis=0)
            lead = local & (before == 0)
            # one atomic per (chunk, expert): the chunk's rows of each of its experts
            base = tl.atomic_add(expert_counter + le, total, mask=lead, sem="relaxed",
                                 scope="gpu")
            base = tl.where(lead, base, 0)
            slot = tl.sum(tl.where(same & lead[:, None], base[:, None], 0), axis=0) + before
            kept = local & (slot < cap)
            dst = tl.where(kept, le * cap + slot, -1)
            tl.store(token_rows + (s * max_tokens + tj) * KP + js % KP, dst, mask=valid)
            dst2 = tl.reshape(dst, [CHUNK, KP])
            ci = tl.arange(0, CHUNK)
            for i in range(0, tl.minimum(CHUNK, n - c * CHUNK)):
                d = tl.sum(tl.where(ci[:, None] == i, dst2, 0), axis=0)
                copy_token(tokens, base_row + c * CHUNK + i, d, d >= 0, expert_x,
                           expert_x_scale, world, max_tokens, H, KP, FP8, BLOCK_H)
    dispatch_recv_end(npid, epoch, t0, my_flags, state, recv_count, expert_counter,
                      expert_num_tokens, expert_x, expert_x_scale, ctrl, trace_buf, rank, world,
                      experts_per_rank, cap, H, WP, FP8, BLOCK_L, BLOCK_H, TRACE)


@triton.jit
def ht_dispatch_kernel(x, stride_x, topk_idx, stride_it, stride_ik, topk_weights, stride_wt,
                       stride_wk, num_tokens, tokens, meta, dweights, flags, fps,
                       chunk_flags, state, send_slot, expert_counter, token_rows, recv_count,
                       expert_x, expert_x_scale, expert_num_tokens, ctrl, heap_bases,
                       trace_buf, rank, world, max_tokens, experts_per_rank, num_experts, cap,
                       check_ids, send_programs, fp, PART: tl.constexpr, H: tl.constexpr, K: tl.constexpr,
                       KP: tl.constexpr, WP: tl.constexpr, HAS_WEIGHTS: tl.constexpr,
                       FP8: tl.constexpr, CHUNK: tl.constexpr, BLOCK_L: tl.constexpr,
                       BLOCK_H: tl.constexpr, TRACE: tl.constexpr, PDL: tl.constexpr):
    B.begin_launch(PDL)         # before any global access (buffers.begin_launch)
    pid = tl.program_id(0)
    n_send = B.senders(send_programs, PART)
    if pid < n_send:
        if PART != B.RECV:
            ht_dispatch_send(pid, n_send, x, stride_x, topk_idx, stride_it, stride_ik,
                             topk_weights, stride_wt, stride_wk, num_tokens, tokens, meta,
                             dweights, flags, fps, chunk_flags, state, send_slot, ctrl,
                             heap_bases, trace_buf, rank, world, max_tokens,
                             experts_per_rank, num_experts, check_ids, fp, H, K, KP, WP,
                             HAS_WEIGHTS, FP8, CHUNK, BLOCK_H, TRACE)
    else:
        if PART != B.SEND:
            ht_dispatch_recv(pid - n_send, tl.num_programs(0) - n_send, tokens, meta, flags,
                             fps, chunk_flags, state, expert_counter, token_rows, recv_count,
                             expert_x, expert_x_scale, expert_num_tokens, ctrl, heap_bases,
                             trace_buf, rank, world, max_tokens, experts_per_rank, cap, fp, H,
                             KP, WP, FP8, CHUNK, BLOCK_L, BLOCK_H, TRACE)


@triton.jit
def ht_combine_send(pid, npid, expert_y, stride_ye, stride_yr, topk_weights, stride_wt,
                    stride_wk, num_tokens, send_slot, token_rows, recv_count, weights,
                    partial, flags, fps, chunk_flags, state, ctrl, heap_bases, trace_buf, rank,
                    world, max_tokens, cap, num_weight_programs, fp, H: tl.constexpr,
                    K: tl.constexpr, KP: tl.constexpr, WP: tl.constexpr,
                    WEIGHTS_AT_DISPATCH: tl.constexpr, ONE_PASS: tl.constexpr,
                    CHUNK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                    TRACE: tl.constexpr):
    epoch, par, wpar, t0 = combine_send_begin(state, WEIGHTS_AT_DISPATCH, TRACE)
    if pid < num_weight_programs:
        push_weights(pid, topk_weights, stride_wt, stride_wk, num_tokens, send_slot,
                     weights, flags, fps, state, heap_bases, trace_buf, rank, world,
                     max_tokens, num_weight_programs, epoch, t0, fp, K, KP, WP, BLOCK_T,
                     TRACE)
    else:
        q = pid - num_weight_programs
        nq = npid - num_weight_programs
        rs = tl.arange(0, WP)
        counts = tl.load(recv_count + rs, mask=rs < world, other=0)
        # chunk 0 of every source is flagged even when it holds no token: the receivers of
        # a rank with none wait for it, which orders that rank's next combine after this
        # one (see ht_combine_recv)
        most = tl.maximum(tl.cdiv(tl.max(counts), CHUNK), 1)
        # ONE_PASS: only the other ranks' tokens (this rank's own partial is summed by its
        # receivers, from expert_y); else every rank's, this one's staged in `partial`
        nsrc = world - 1 if ONE_PASS else world
        ok = tl.cast(1, tl.int1)      # no wait of this program failed: it may push
        waited = tl.cast(0, tl.int32)     # bit s: source s's weights have come
        for item in range(q, most * nsrc, nq):
            c = item // nsrc          # chunk-major: the order receivers consume them
            s = (rank + 1 + item % nsrc) % world    # programs spread over the links
            n = tl.sum(tl.where(rs == s, counts, 0))
            if not WEIGHTS_AT_DISPATCH:
                # at chunk 0 also from a source with no token (its one weight program
                # signals all the same): a source that kept its weights at dispatch
                # instead (another call: the fingerprint differs) then never signals, and
                # its receivers find it (ht_combine_recv) -- else, with T = 0 there, the
                # two calls would not meet at any fingerprint and each side's partials
                # would use other weights, silently
                if ok & ((c * CHUNK < n) | (c == 0)) & (((waited >> s) & 1) == 0):
                    ok = B.wait_call(flags, fps, B.FLAG_WEIGHTS, par, world, s, epoch, fp,
                                     ctrl, rank, B.OP_COMBINE)
                    waited = waited | (1 << s)
            if ok & ((c * CHUNK < n) | (c == 0)):
                for i in range(c * CHUNK, tl.minimum(c * CHUNK + CHUNK, n)):
                    push_partial(i, s, expert_y, stride_ye, stride_yr, token_rows, weights,
                                 partial, heap_bases, rank, world, max_tokens, cap, par,
                                 wpar, H, KP, BLOCK_H)
                tdl.signal(_chunk_flag(chunk_flags, B.CHUNK_COMBINE, rank, c, world,
                                       max_tokens, CHUNK), epoch, rank, s, heap_bases)
        trd.end(trace_buf, t0, tags.COMBINE, rank, TRACE)
    if tdl.last_program_out(state + B.COMBINE_SEND_DONE, npid):
        tl.store(state + B.COMBINE_SEND_EPOCH, epoch)


@triton.jit
def ht_combine_recv(pid, npid, out, expert_y, stride_ye, stride_yr, topk_weights, stride_wt,
                    stride_wk, num_tokens, send_slot, token_rows, weights, partial, flags,
                    fps, chunk_flags, state, ctrl, rank, world, max_tokens, cap, trace_buf,
                    fp, H: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
                    WP: tl.constexpr, WEIGHTS_AT_DISPATCH: tl.constexpr,
                    ONE_PASS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_H: tl.constexpr,
                    TRACE: tl.constexpr):
    epoch = tdl.launch_epoch(state + B.COMBINE_RECV_EPOCH)
    par = epoch % 2
    # with the weights at dispatch, a chunk's wait also watches the source's weights flag
    # (polled with its control block only, never on a wait that finds its flag): a source
    # that sent weights in this launch made the other call (weights at combine, another
    # fingerprint) and waits for ours, which never come -- CallMismatch at once, not the
    # timeout (tdl.wait's SIBLINGS)
    SIBLINGS: tl.constexpr = 1 if WEIGHTS_AT_DISPATCH else 0
    if WEIGHTS_AT_DISPATCH:     # this rank's own weights, in dispatch's half of dweights
        wpar = tl.load(state + B.DISPATCH_RECV_EPOCH) % 2
    t0 = trd.begin(TRACE)
    ks = tl.arange(0, KP)
    ok = tl.cast(1, tl.int1)
    # at least chunk 0, also with no token: a rank with none would otherwise wait for
    # nobody, and with the weights sent at dispatch its next combines could run ahead and
    # overwrite the half of a peer's `partial` that the peer still reads (two epochs on)
    for c in range(pid, tl.maximum(tl.cdiv(num_tokens, CHUNK), 1), npid):
        for j in range(1 if ONE_PASS else 0, world):
            r = (rank + j) % world      # ONE_PASS: this rank's own part needs no flag
            if not WEIGHTS_AT_DISPATCH:
                if ok & (c == pid):
                    # before this program sums its first chunk of r: r's call is this one
                    # (its weights flag carries the fingerprint). Else a source that kept
                    # its weights at dispatch (another call) pushes partials made with
                    # other weights, these receivers sum them and finish before this
                    # rank's senders fail, and the output is left plausible, not poisoned
                    ok = B.wait_call(flags, fps, B.FLAG_WEIGHTS, par, world, r, epoch, fp,
                                     ctrl, rank, B.OP_COMBINE)
            if ok:
                wslot = (B.FLAG_WEIGHTS * 2 + par) * world + r
                ok = tdl.wait(_chunk_flag(chunk_flags, B.CHUNK_COMBINE, r, c, world,
                                          max_tokens, CHUNK), epoch, ctrl, rank, r,
                              B.OP_COMBINE, siblings=flags + wslot, fp_at=fps + wslot,
                              fp=fp, SIBLINGS=SIBLINGS, SIBLING_STRIDE=1)
        if ok:
            for t in range(c * CHUNK, tl.minimum(c * CHUNK + CHUNK, num_tokens)):
                if ONE_PASS:
                    if WEIGHTS_AT_DISPATCH:
                        w = tl.load(weights + ((wpar * world + rank) * max_tokens + t) * KP
                                    + ks)
                    else:
                        w = tl.load(topk_weights + t * stride_wt + ks * stride_wk,
                                    mask=ks < K, other=0.0)
                    sum_token(t, out, expert_y, stride_ye, stride_yr, w, send_slot,
                              token_rows, partial, rank, world, max_tokens, cap, par, H, KP,
                              WP, BLOCK_H)
                else:
                    sum_partials(t, out, send_slot, partial, world, max_tokens, par, H, WP,
                                 BLOCK_H)
    combine_recv_end(npid, epoch, t0, out, num_tokens, state, ctrl, trace_buf, rank, H,
                     BLOCK_H, TRACE)


@triton.jit
def ht_combine_kernel(expert_y, stride_ye, stride_yr, topk_weights, stride_wt, stride_wk, out,
                      num_tokens, send_slot, token_rows, recv_count, weights, partial, flags,
                      fps, chunk_flags, state, ctrl, heap_bases, trace_buf, rank, world,
                      max_tokens, cap, num_weight_programs, send_programs, fp,
                      PART: tl.constexpr, H: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
                      WP: tl.constexpr, WEIGHTS_AT_DISPATCH: tl.constexpr,
                      CHUNK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                      TRACE: tl.constexpr, PDL: tl.constexpr):
    B.begin_launch(PDL)         # before any global access (buffers.begin_launch)
    # one launch (PART BOTH): the receivers sum this rank's own part from expert_y; split
    # halves and PART STAGED (A/B timing) stage it in `partial` like the other ranks' parts
    ONE_PASS: tl.constexpr = PART == B.BOTH
    pid = tl.program_id(0)
    n_send = B.senders(send_programs, PART)
    if pid < n_send:
        if PART != B.RECV:
            ht_combine_send(pid, n_send, expert_y, stride_ye, stride_yr, topk_weights,
                            stride_wt, stride_wk, num_tokens, send_slot, token_rows,
                            recv_count, weights, partial, flags, fps, chunk_flags, state, ctrl,
                            heap_bases, trace_buf, rank, world, max_tokens, cap,
                            num_weight_programs, fp, H, K, KP, WP, WEIGHTS_AT_DISPATCH,
                            ONE_PASS, CHUNK, BLOCK_T, BLOCK_H, TRACE)
    else:
        if PART != B.SEND:
            ht_combine_recv(pid - n_send, tl.num_programs(0) - n_send, out, expert_y,
                            stride_ye, stride_yr, topk_weights, stride_wt, stride_wk,
                            num_tokens, send_slot, token_rows, weights, partial, flags, fps,
                            chunk_flags, state, ctrl, rank, world, max_tokens, cap,
                            trace_buf, fp, H, K, KP, WP, WEIGHTS_AT_DISPATCH, ONE_PASS,
                            CHUNK, BLOCK_H, TRACE)
