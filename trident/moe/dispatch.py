"""MoE dispatch: send each token to the ranks that own its experts, then lay the received
tokens out per local expert (expert_x [L, cap, H], expert_num_tokens [L]).

Send (`dispatch_send`): programs take tokens round-robin. A token's ids are checked as
they are read (routing.py: out-of-range and repeated ids are dropped and recorded). The set
of destination ranks comes from its top-k ids; the token row (and its top-k weights, when
dispatch is given them: then combine need not send them) is pushed once into each
destination's receive buffer -- once per rank, however many of its experts live there --
at the token's own index (no slot to claim), and its ids go to every rank, so that a
receiver can tell its tokens from the others'. Then each program signals every rank
itself, `epoch << 32 | T` (buffers.py "Low latency"): as many send programs on every
rank (per max_num_tokens, not T), so a receiver knows whose signals to wait for; a rank
with no token is signalled too. Nothing here waits.

Receive (`dispatch_recv`): one source after another, this rank first, wait for all the
source's send programs at once, then copy its tokens while the next source's are still
in flight. The tokens of all sources form one list spread evenly over the programs; each
token of this rank is copied from the receive buffer into one row of each of its local
experts, the row counted straight in expert_num_tokens (zeroed by this rank's send
program 0 before its signal, which every receiver waits for first). The call's
fingerprint is checked after the copy (buffers.wait_programs). The copy is local (HBM),
the NVLink traffic is only the deduplicated push. No arrival counter, last program or
count publication is on the chain: the launch's last program (a GPU-scope count at the
end) stores the epochs and, after a failed wait, poisons the outputs.

What this chain replaced (issue 39 item 4): an acq_rel system-scope arrival counter in
every send program, then the last one claiming the counts and signalling; a slot claimed
per token and destination (an atomic round trip before its first store); a second
arrival counter in the receivers and a last program that swapped the per-expert
counters into expert_num_tokens. `git log` on this file holds that version for an A/B.

FP8 (dispatch(..., fp8=True); fp8.py): the send half quantises each token row to e4m3
with one fp32 scale per 128 channels and pushes the bytes (as int32 words) and the
scales into the same receive buffer, seen as words (`fp8_scale_base`); the receive half
copies them into expert_x (float8_e4m3fn, passed as int32 words) and expert_x_scale.

`dispatch_kernel` runs one half (PART = SEND or RECV: split mode, whose .wait() launches
the receive half) or both in one launch (PART = BOTH): programs [0, send_programs) send,
the others receive. The receivers wait only for the senders (lower program ids) and for
other ranks, so the grid cannot deadlock, and the CPU emulation, which runs programs in
order, works.

Launched with programmatic dependent launch on sm_90+ (plans.py `PDL`): every program's
first act, before any global access (the epochs, the flags, x and topk_idx), is
buffers.begin_launch -- wait for the kernels before it in the stream to complete, then
let the next kernel launch -- so the ordering is plain stream order's.
"""
import triton
import triton.language as tl

from .. import language as tdl
from ..ccl.device import same_call
from ..trace import device as trd
from ..trace import tags
from . import buffers as B
from . import fp8
from .routing import expert_ids


@triton.jit
def fp8_scale_base(world, max_tokens, H: tl.constexpr):
    """fp8 dispatch reuses the receive buffer `tokens` (seen as int32 words): the e4m3
    rows first ([2, world, M, H/4] words), then the scales ([2, world, M, H/128] fp32)."""
    return tl.cast(2 * world, tl.int64) * max_tokens * (H // 4)


@triton.jit
def copy_rows(dst_rows, src, rows_mask, n: tl.constexpr, KP: tl.constexpr,
              BLOCK: tl.constexpr, stride=1):
    """Copy n words at `src` into each row of `dst_rows` ([KP, 1] pointers) where
    `rows_mask` is set, word j at dst_rows + j * stride."""
    cols = tl.arange(0, BLOCK)
    for c in tl.static_range(0, n, BLOCK):
        m = c + cols < n
        v = tl.load(src + c + cols, mask=m)
        tl.store(dst_rows + (c + cols[None, :]) * stride,
                 tl.broadcast_to(v[None, :], (KP, BLOCK)),
                 mask=rows_mask[:, None] & m[None, :])


@triton.jit
def push_payload(src, row, t, r, tokens, dweights, topk_weights, stride_wt, stride_wk, rank,
                 heap_bases, world, max_tokens, H: tl.constexpr, K: tl.constexpr,
                 KP: tl.constexpr, HAS_WEIGHTS: tl.constexpr, FP8: tl.constexpr,
                 BLOCK_H: tl.constexpr):
    """Push token t's row at `src` (and its top-k weights, with HAS_WEIGHTS) into row `row`
    of rank r's receive buffer: 16-byte vector stores (BLOCK_H bf16 values per step, 16
    bytes per thread at 4 warps). Shared by both paths."""
    if HAS_WEIGHTS:
        ks = tl.arange(0, KP)
        w = tl.load(topk_weights + t * stride_wt + ks * stride_wk, mask=ks < K, other=0.0)
        tdl.store(dweights + row * KP + ks, w, rank, r, heap_bases)
    if FP8:
        # quantised again per destination (values in registers cannot be kept across the
        # loop over ranks). Steps of 2 * BLOCK_H channels: the e4m3 bytes are as many as
        # BLOCK_H bf16 values, 16 per thread
        G: tl.constexpr = 2 * BLOCK_H // fp8.GROUP      # scale groups per step
        GW: tl.constexpr = fp8.GROUP // 4               # int32 words per group
        groups = tl.arange(0, G)
        chan = tl.arange(0, fp8.GROUP)
        wcols = tl.arange(0, GW)
        scales = tokens + fp8_scale_base(world, max_tokens, H)
        for c in tl.static_range(0, H, 2 * BLOCK_H):
            gm = c // fp8.GROUP + groups < H // fp8.GROUP
            v = tl.load(src + c + groups[:, None] * fp8.GROUP + chan[None, :],
                        mask=gm[:, None], other=0.0)
            words, scale = fp8.quantize_groups(v.to(tl.float32), G)
            tdl.store(tokens + row * (H // 4) + c // 4 + groups[:, None] * GW
                      + wcols[None, :], words, rank, r, heap_bases, mask=gm[:, None])
            tdl.store(scales + row * (H // fp8.GROUP) + c // fp8.GROUP + groups,
                      scale.to(tl.int32, bitcast=True), rank, r, heap_bases, mask=gm)
    else:
        cols = tl.arange(0, BLOCK_H)
        for c in tl.static_range(0, H, BLOCK_H):
            m = c + cols < H
            v = tl.load(src + c + cols, mask=m)
            tdl.store(tokens + row * H + c + cols, v, rank, r, heap_bases, mask=m)


@triton.jit
def copy_token(tokens, row, dst, local, expert_x, expert_x_scale, world, max_tokens,
               H: tl.constexpr, KP: tl.constexpr, FP8: tl.constexpr, BLOCK_H: tl.constexpr):
    """Copy received row `row` of the receive buffer into expert_x rows `dst` ([KP], where
    `local`): local HBM, 16-byte vectors. Shared by both paths.

    fp8: expert_x_scale is column-major per expert (buffers.Buffers.fp8_outputs: memory
    [L, H/128, cap], DeepEP's and DeepGEMM's layout), so row dst = e * cap + i has its
    scale g at (e * H/128 + g) * cap + i."""
    if FP8:     # the e4m3 bytes as int32 words, then the scales (fp32 bits)
        scales = tokens + fp8_scale_base(world, max_tokens, H)
        copy_rows(expert_x + dst.to(tl.int64)[:, None] * (H // 4),
                  tokens + tl.cast(row, tl.int64) * (H // 4), local, H // 4,
                  KP, BLOCK_H // 2)
        cap = tl.cast(world, tl.int64) * max_tokens
        d = dst.to(tl.int64)
        e = d // cap
        copy_rows(expert_x_scale + (e * (H // fp8.GROUP) * cap + d - e * cap)[:, None],
                  scales + tl.cast(row, tl.int64) * (H // fp8.GROUP), local,
                  H // fp8.GROUP, KP, fp8.SCALE_BLOCK, cap)
    else:
        cols = tl.arange(0, BLOCK_H)
        dst_ptr = expert_x + dst.to(tl.int64)[:, None] * H
        src = tokens + tl.cast(row, tl.int64) * H
        for c in tl.static_range(0, H, BLOCK_H):
            m = c + cols < H
            v = tl.load(src + c + cols, mask=m)
            tl.store(dst_ptr + c + cols[None, :],
                     tl.broadcast_to(v[None, :], (KP, BLOCK_H)),
                     mask=local[:, None] & m[None, :])


@triton.jit
def dispatch_recv_begin(flags, fps, state, ctrl, trace_buf, rank, world, fp,
                        TRACE: tl.constexpr):
    """The start of a receive half, both paths: this launch's epoch and its parity, this
    rank's dispatch flags (my_flags: one per source), and whether every rank's dispatch
    flag came from this call (ok); the wait is traced as WAIT, and the trace slice that
    follows starts here (t0)."""
    epoch = tdl.launch_epoch(state + B.DISPATCH_RECV_EPOCH)
    par = epoch % 2
    my_flags = flags + (B.FLAG_DISPATCH * 2 + par) * world
    t0 = trd.begin(TRACE)
    ok = B.wait_calls(flags, fps, B.FLAG_DISPATCH, par, world, epoch << B.COUNT_BITS, fp,
                      ctrl, rank, B.OP_DISPATCH)
    trd.end(trace_buf, t0, tags.WAIT, rank, TRACE)
    t0 = trd.begin(TRACE)
    return epoch, par, my_flags, ok, t0


@triton.jit
def dispatch_recv_end(npid, epoch, t0, my_flags, state, recv_count, expert_counter,
                      expert_num_tokens, expert_x, expert_x_scale, ctrl, trace_buf, rank, world,
                      experts_per_rank, cap, H: tl.constexpr, WP: tl.constexpr,
                      FP8: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_H: tl.constexpr,
                      TRACE: tl.constexpr):
    """The end of a receive half, both paths: the RECV trace slice since t0; the last of
    the npid receivers publishes the counts (publish_counts) and stores the epoch."""
    trd.end(trace_buf, t0, tags.RECV, rank, TRACE)
    if tdl.last_program_out(state + B.DISPATCH_RECV_DONE, npid):
        publish_counts(my_flags, recv_count, expert_counter, expert_num_tokens, expert_x,
                       expert_x_scale, ctrl, world, experts_per_rank, cap, H, WP, FP8,
                       BLOCK_L, BLOCK_H)
        tl.store(state + B.DISPATCH_RECV_EPOCH, epoch)


@triton.jit
def publish_counts(my_flags, recv_count, expert_counter, expert_num_tokens, expert_x,
                   expert_x_scale, ctrl, world, experts_per_rank, cap, H: tl.constexpr,
                   WP: tl.constexpr, FP8: tl.constexpr, BLOCK_L: tl.constexpr,
                   BLOCK_H: tl.constexpr):
    """The last receiver: tokens received per source (from the dispatch flags) and rows
    per local expert (zeroing the counters for the next epoch). If a wait of this rank
    failed, the outputs are poisoned instead (buffers.py "Calls"): every row of expert_x
    (and its fp8 scales) all bits set, every count -1."""
    failed = B.launch_failed(ctrl)
    rs = tl.arange(0, WP)
    counts = tl.load(my_flags + rs, mask=rs < world, other=0, volatile=True) & B.COUNT_MASK
    tl.store(recv_count + rs, counts.to(tl.int32))
    for l0 in range(0, experts_per_rank, BLOCK_L):
        ls = l0 + tl.arange(0, BLOCK_L)
        lm = ls < experts_per_rank
        got = tl.atomic_xchg(expert_counter + ls, 0, mask=lm, sem="relaxed", scope="gpu")
        tl.store(expert_num_tokens + ls, tl.where(failed, -1, tl.minimum(got, cap)), mask=lm)
    if failed:
        poison_expert_x(expert_x, expert_x_scale, experts_per_rank, cap, H, FP8, BLOCK_H)


@triton.jit
def poison_expert_x(expert_x, expert_x_scale, experts_per_rank, cap, H: tl.constexpr,
                    FP8: tl.constexpr, BLOCK_H: tl.constexpr):
    """Every row of expert_x (and its fp8 scales) all bits set: a failed dispatch's."""
    rows = tl.cast(experts_per_rank, tl.int64) * cap
    if FP8:     # the e4m3 bytes as int32 words (0xFF: NaN), then the fp32 scales
        B.poison_outputs(expert_x, rows * (H // 4), BLOCK_H)
        B.poison_outputs(expert_x_scale, rows * (H // fp8.GROUP), BLOCK_H)
    else:
        B.poison_outputs(expert_x, rows * H, BLOCK_H)


@triton.jit
def dispatch_send(pid, npid, x, stride_x, topk_idx, stride_it, stride_ik, topk_weights,
                  stride_wt, stride_wk, num_tokens, tokens, meta, dweights, flags, fps, slots,
                  state, send_slot, expert_num_tokens, ctrl, heap_bases, trace_buf, rank,
                  world, max_tokens, experts_per_rank, num_experts, check_ids, fp,
                  H: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, WP: tl.constexpr,
                  NS: tl.constexpr, HAS_WEIGHTS: tl.constexpr, FP8: tl.constexpr,
                  BLOCK_L: tl.constexpr, BLOCK_H: tl.constexpr, TRACE: tl.constexpr):
    t0 = trd.begin(TRACE)
    epoch = tdl.launch_epoch(state + B.DISPATCH_SEND_EPOCH)
    par = epoch % 2
    if pid == 0:
        # the counts of the dispatch before, zeroed for this one's receivers: they count
        # into them after the wait for this rank's program 0, their first (dispatch_recv)
        for l0 in range(0, experts_per_rank, BLOCK_L):
            ls = l0 + tl.arange(0, BLOCK_L)
            tl.store(expert_num_tokens + ls, 0, mask=ls < experts_per_rank)
    ks = tl.arange(0, KP)
    rs = tl.arange(0, WP)
    for t in range(pid, num_tokens, npid):
        e = expert_ids(topk_idx, t, stride_it, stride_ik, num_experts, ctrl, check_ids, K, KP)
        dest = tl.where(e >= 0, e // experts_per_rank, -1)
        hit = tl.max((dest[None, :] == rs[:, None]).to(tl.int32), axis=1)
        tl.store(send_slot + t * WP + rs, tl.where(hit > 0, t, -1))
        row = (par * world + rank).to(tl.int64) * max_tokens + t
        src = x + tl.cast(t, tl.int64) * stride_x
        for j in range(world):
            r = (t + j) % world             # programs spread over the links
            # the ids go to every rank: a receiver tells from them which tokens are its own
            tdl.store(meta + row * KP + ks, e, rank, r, heap_bases)
            if tl.sum(tl.where(rs == r, hit, 0)) > 0:
                push_payload(src, row, t, r, tokens, dweights, topk_weights, stride_wt,
                             stride_wk, rank, heap_bases, world, max_tokens, H, K, KP,
                             HAS_WEIGHTS, FP8, BLOCK_H)
    trd.end(trace_buf, t0, tags.DISPATCH, rank, TRACE)
    B.signal_program(flags, fps, slots, B.FLAG_DISPATCH, par, world, rank, pid,
                     (epoch << B.COUNT_BITS) | tl.cast(num_tokens, tl.int64), fp, heap_bases,
                     NS, WP)


@triton.jit
def dispatch_recv(pid, npid, tokens, meta, flags, fps, slots, state, token_rows, recv_count,
                  expert_x, expert_x_scale, expert_num_tokens, ctrl, trace_buf, rank, world,
                  max_tokens, experts_per_rank, cap, peer_programs, fp, H: tl.constexpr,
                  KP: tl.constexpr, NS: tl.constexpr, NP: tl.constexpr, FP8: tl.constexpr,
                  BLOCK_H: tl.constexpr, TRACE: tl.constexpr):
    epoch = tdl.launch_epoch(state + B.DISPATCH_RECV_EPOCH)
    par = epoch % 2
    ks = tl.arange(0, KP)
    first_expert = rank * experts_per_rank
    start = 0
    ok = tl.cast(1, tl.int1)
    for j in range(world):
        # this rank first: its program 0 zeroed the counts before its signal
        s = (rank + j) % world
        n = 0
        theirs = tl.cast(0, tl.int64)
        if ok:
            tw = trd.begin(TRACE)
            ok, word, theirs = B.wait_programs(flags, fps, slots, B.FLAG_DISPATCH, par,
                                               world, s, peer_programs,
                                               epoch << B.COUNT_BITS, fp, ctrl, rank,
                                               B.OP_DISPATCH, NS, NP)
            trd.end(trace_buf, tw, tags.WAIT, rank, TRACE)
            # nothing from a failed wait: the launch's last program poisons the outputs.
            # The call is checked after the copy (B.wait_programs): the count is clamped
            n = tl.where(ok, tl.minimum(word & B.COUNT_MASK, max_tokens), 0).to(tl.int32)
        t0 = trd.begin(TRACE)
        # source s's tokens, as soon as they are here; the tokens of all sources form one
        # list, program pid takes every npid-th of it
        i0 = (pid - start % npid + npid) % npid
        for i in range(i0, n, npid):
            row = (par * world + s) * max_tokens + i
            e = tl.load(meta + row * KP + ks)
            local = (e >= first_expert) & (e < first_expert + experts_per_rank)
            le = e - first_expert
            slot = tl.atomic_add(expert_num_tokens + le, 1, mask=local, sem="relaxed",
                                 scope="gpu")
            local = local & (slot < cap)
            dst = tl.where(local, le * cap + slot, -1)
            tl.store(token_rows + (s * max_tokens + i) * KP + ks, dst)
            if tl.max(local.to(tl.int32)) > 0:
                copy_token(tokens, row, dst, local, expert_x, expert_x_scale, world,
                           max_tokens, H, KP, FP8, BLOCK_H)
        trd.end(trace_buf, t0, tags.RECV, rank, TRACE)
        ok = same_call(theirs, fp, ok, ctrl, rank, s, B.OP_DISPATCH)
        if pid == 0:    # read by combine: nothing from another call
            tl.store(recv_count + s, tl.where(ok, n, 0))
        start += n


@triton.jit
def dispatch_kernel(x, stride_x, topk_idx, stride_it, stride_ik, topk_weights, stride_wt,
                    stride_wk, num_tokens, tokens, meta, dweights, flags, fps, slots, state,
                    send_slot, token_rows, recv_count, expert_x, expert_x_scale,
                    expert_num_tokens, ctrl, heap_bases, trace_buf, rank, world, max_tokens,
                    experts_per_rank, num_experts, cap, check_ids, send_programs,
                    peer_programs, fp, PART: tl.constexpr, H: tl.constexpr, K: tl.constexpr,
                    KP: tl.constexpr, WP: tl.constexpr, NS: tl.constexpr, NP: tl.constexpr,
                    HAS_WEIGHTS: tl.constexpr, FP8: tl.constexpr, BLOCK_L: tl.constexpr,
                    BLOCK_H: tl.constexpr, TRACE: tl.constexpr, PDL: tl.constexpr):
    B.begin_launch(PDL)         # before any global access (buffers.begin_launch)
    pid = tl.program_id(0)
    n_send = B.senders(send_programs, PART)
    if pid < n_send:
        if PART != B.RECV:
            dispatch_send(pid, n_send, x, stride_x, topk_idx, stride_it, stride_ik,
                          topk_weights, stride_wt, stride_wk, num_tokens, tokens, meta,
                          dweights, flags, fps, slots, state, send_slot, expert_num_tokens,
                          ctrl, heap_bases, trace_buf, rank, world, max_tokens,
                          experts_per_rank, num_experts, check_ids, fp, H, K, KP, WP, NS,
                          HAS_WEIGHTS, FP8, BLOCK_L, BLOCK_H, TRACE)
    else:
        if PART != B.SEND:
            dispatch_recv(pid - n_send, tl.num_programs(0) - n_send, tokens, meta, flags,
                          fps, slots, state, token_rows, recv_count, expert_x,
                          expert_x_scale, expert_num_tokens, ctrl, trace_buf, rank, world,
                          max_tokens, experts_per_rank, cap, peer_programs, fp, H, KP, NS,
                          NP, FP8, BLOCK_H, TRACE)
    # off the chain: every program signalled its peers itself. The last one of the launch
    # (senders too: their program 0 zeroed the counts) stores the epochs and, if a wait
    # of this rank failed, poisons the outputs (buffers.py "Calls")
    done = B.DISPATCH_SEND_DONE if PART == B.SEND else B.DISPATCH_RECV_DONE
    if tdl.last_program_out(state + done, tl.num_programs(0), SYS=False):
        if PART != B.SEND:
            if B.launch_failed(ctrl):
                for l0 in range(0, experts_per_rank, BLOCK_L):
                    ls = l0 + tl.arange(0, BLOCK_L)
                    tl.store(expert_num_tokens + ls, -1, mask=ls < experts_per_rank)
                poison_expert_x(expert_x, expert_x_scale, experts_per_rank, cap, H, FP8,
                                BLOCK_H)
            tl.store(state + B.DISPATCH_RECV_EPOCH, tl.load(state + B.DISPATCH_RECV_EPOCH) + 1)
        if PART != B.RECV:
            tl.store(state + B.DISPATCH_SEND_EPOCH, tl.load(state + B.DISPATCH_SEND_EPOCH) + 1)

