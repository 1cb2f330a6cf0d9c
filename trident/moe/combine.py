"""MoE combine: y[t] = sum_k w[t, k] * expert_y[row of (t, k)], accumulated in fp32.

Send (`combine_send`), two kinds of programs:
  - the first `num_weight_programs` push the top-k weights of this rank's tokens (a tile
    of tokens at a time, 32 bytes per token and destination) next to the copies of the
    tokens that dispatch put on each expert rank, then each signals "weights" to every
    rank itself (buffers.py "Low latency": as many weight programs on every rank, per
    max_num_tokens).
  - the others run on the expert side: for every token received at dispatch they form
    the weighted partial sum over *this* rank's experts of that token in fp32, and push
    it once (in x's dtype) back into the token's rank, at the token's index there. So a
    token comes back once per expert rank, not once per expert. Sources are taken from
    the next rank on (programs spread over the links, this rank last); before its first
    token of a source, a program waits for all that source's weight programs at once.
    Then each program signals "partials" to every rank itself, unless one of its waits
    failed.
  When the weights came with dispatch (dispatch(..., topk_weights=w)), they are already
  next to the tokens: there are no weight programs and the send half waits for nothing.

Receive (`combine_recv`): wait for all expert programs of every rank (one look per
source), then each token sums its (at most world) partials in fp32 and writes y[t].
Every signal carries the call's fingerprint; the launch's last program (a GPU-scope count
after every signal) stores the epochs and, if a wait of this rank failed, leaves y all
NaN (buffers.py "Calls"). Before (issue 39 item 4) the weights and the partials each
went through an acq_rel system-scope arrival counter and a last program that signalled
rank by rank, one system fence per rank in series.

`combine_kernel` runs one half (PART = SEND or RECV: split mode) or both in one launch
(PART = BOTH): weight programs first, then expert programs, then receivers. A program
waits only for work of lower program ids or of other ranks, so the grid cannot
deadlock, and the CPU emulation, which runs programs in order, works.

Launched with programmatic dependent launch on sm_90+ (plans.py `PDL`), as dispatch is:
every program's first act, before any global access (the epochs, the flags, expert_y
and the weights), is buffers.begin_launch -- wait for the kernels before it in the
stream (the user's expert GEMM among them) to complete, then let the next one launch.
"""
import triton
import triton.language as tl

from .. import language as tdl
from ..ccl.device import same_call
from ..trace import device as trd
from ..trace import tags
from . import buffers as B


@triton.jit
def push_weights(pid, topk_weights, stride_wt, stride_wk, num_tokens, send_slot, weights,
                 flags, fps, state, heap_bases, trace_buf, rank, world, max_tokens,
                 num_weight_programs, epoch, t0, fp, K: tl.constexpr, KP: tl.constexpr,
                 WP: tl.constexpr, BLOCK_T: tl.constexpr, TRACE: tl.constexpr):
    """A weight program: push the top-k weights of a tile of this rank's tokens at a time
    next to their copies on each rank they went to (row: send_slot); the last weight
    program signals "weights" to every rank. Traced as SEND, from t0. Shared by both
    paths."""
    par = epoch % 2
    store_weights(pid, topk_weights, stride_wt, stride_wk, num_tokens, send_slot, weights,
                  heap_bases, rank, world, max_tokens, num_weight_programs, par, K, KP, WP,
                  BLOCK_T)
    if tdl.last_program_out(state + B.WEIGHTS_DONE, num_weight_programs):
        for r in range(world):
            B.signal_call(flags, fps, B.FLAG_WEIGHTS, par, world, rank, r, epoch, fp,
                          heap_bases)
    trd.end(trace_buf, t0, tags.SEND, rank, TRACE)


@triton.jit
def store_weights(pid, topk_weights, stride_wt, stride_wk, num_tokens, send_slot, weights,
                  heap_bases, rank, world, max_tokens, num_weight_programs, par,
                  K: tl.constexpr, KP: tl.constexpr, WP: tl.constexpr, BLOCK_T: tl.constexpr):
    """Weight program pid's stores: the top-k weights of a tile of this rank's tokens at a
    time, next to their copies on each rank they went to (row: send_slot), in half par."""
    ks = tl.arange(0, KP)
    ts0 = tl.arange(0, BLOCK_T)
    for tb in range(pid * BLOCK_T, num_tokens, num_weight_programs * BLOCK_T):
        ts = tb + ts0
        tm = ts < num_tokens
        w = tl.load(topk_weights + ts[:, None] * stride_wt + ks[None, :] * stride_wk,
                    mask=tm[:, None] & (ks[None, :] < K), other=0.0)
        for r in range(world):
            slot = tl.load(send_slot + ts * WP + r, mask=tm, other=-1)
            row = (par * world + rank) * max_tokens + slot
            tdl.store(weights + row[:, None] * KP + ks[None, :], w, rank, r, heap_bases,
                      mask=(slot >= 0)[:, None] & (ks[None, :] < KP))


@triton.jit
def push_partial(i, s, expert_y, stride_ye, stride_yr, token_rows, weights, partial,
                 heap_bases, rank, world, max_tokens, cap, par, wpar, H: tl.constexpr,
                 KP: tl.constexpr, BLOCK_H: tl.constexpr):
    """Token i received from rank s: the fp32 sum over this rank's experts of w * expert_y,
    pushed (in x's dtype) into s's `partial` at [par, this rank, i]. A token with no row
    here sends nothing (the high-throughput path lists every token of s, also those that
    did not come here; its combine receive half reads only ranks the token went to)."""
    ks = tl.arange(0, KP)
    cols = tl.arange(0, BLOCK_H)
    rows = tl.load(token_rows + (s * max_tokens + i) * KP + ks)
    mine = rows >= 0
    if tl.max(mine.to(tl.int32)) > 0:
        src_row = (wpar * world + s) * max_tokens + i
        w = tl.load(weights + src_row * KP + ks, mask=mine, other=0.0)
        expert = rows // cap
        y_ptr = (expert_y + expert.to(tl.int64)[:, None] * stride_ye
                 + (rows - expert * cap).to(tl.int64)[:, None] * stride_yr)
        dst = partial + tl.cast((par * world + rank) * max_tokens + i, tl.int64) * H
        for c in tl.static_range(0, H, BLOCK_H):
            m = c + cols < H
            y = tl.load(y_ptr + c + cols[None, :], mask=mine[:, None] & m[None, :],
                        other=0.0)
            acc = tl.sum(y.to(tl.float32) * w[:, None], axis=0)
            tdl.store(dst + c + cols, acc.to(partial.dtype.element_ty), rank, s,
                      heap_bases, mask=m)


@triton.jit
def sum_partials(t, out, send_slot, partial, world, max_tokens, par, H: tl.constexpr,
                 WP: tl.constexpr, BLOCK_H: tl.constexpr):
    """y[t] = the fp32 sum of token t's partials (one per rank it went to), in out's dtype."""
    rs = tl.arange(0, WP)
    cols = tl.arange(0, BLOCK_H)
    slots = tl.load(send_slot + t * WP + rs)
    has = slots >= 0
    src = partial + ((par * world + rs) * max_tokens + slots).to(tl.int64)[:, None] * H
    dst = out + tl.cast(t, tl.int64) * H
    for c in tl.static_range(0, H, BLOCK_H):
        m = c + cols < H
        v = tl.load(src + c + cols[None, :], mask=has[:, None] & m[None, :], other=0.0)
        acc = tl.sum(v.to(tl.float32), axis=0)
        tl.store(dst + c + cols, acc.to(out.dtype.element_ty), mask=m)


@triton.jit
def sum_token(t, out, expert_y, stride_ye, stride_yr, w, send_slot, token_rows, partial,
              rank, world, max_tokens, cap, par, H: tl.constexpr, KP: tl.constexpr,
              WP: tl.constexpr, BLOCK_H: tl.constexpr):
    """y[t] in one pass (the high-throughput path's fused launch): the fp32 sum over this
    rank's experts of w * expert_y (its rows here, from token_rows; w [KP] its top-k
    weights) plus the partial of every other rank it went to, each read once, written in
    out's dtype. Per step of BLOCK_H columns both tiles' loads ([KP] expert_y rows and [WP]
    partial rows, 16 bytes per thread, masked to the real rows) come before the one store,
    so up to KP + WP rows are in flight; the sum runs in a fixed order (deterministic)."""
    ks = tl.arange(0, KP)
    rs = tl.arange(0, WP)
    cols = tl.arange(0, BLOCK_H)
    rows = tl.load(token_rows + (rank * max_tokens + t) * KP + ks)
    mine = rows >= 0
    w = tl.where(mine, w, 0.0)     # weights of rows not here may be anything (NaN too)
    expert = rows // cap
    y_ptr = (expert_y + expert.to(tl.int64)[:, None] * stride_ye
             + (rows - expert * cap).to(tl.int64)[:, None] * stride_yr)
    slots = tl.load(send_slot + t * WP + rs)
    peer = (slots >= 0) & (rs != rank)
    src = partial + ((par * world + rs) * max_tokens + slots).to(tl.int64)[:, None] * H
    dst = out + tl.cast(t, tl.int64) * H
    for c in tl.static_range(0, H, BLOCK_H):
        m = c + cols < H
        y = tl.load(y_ptr + c + cols[None, :], mask=mine[:, None] & m[None, :], other=0.0)
        v = tl.load(src + c + cols[None, :], mask=peer[:, None] & m[None, :], other=0.0)
        acc = tl.sum(y.to(tl.float32) * w[:, None], axis=0) + tl.sum(v.to(tl.float32), axis=0)
        tl.store(dst + c + cols, acc.to(out.dtype.element_ty), mask=m)


@triton.jit
def combine_send_begin(state, WEIGHTS_AT_DISPATCH: tl.constexpr, TRACE: tl.constexpr):
    """The start of a send half, both paths: this launch's epoch, its parity, the parity of
    the half of `weights` the weights are in (wpar), and the trace start t0."""
    epoch = tdl.launch_epoch(state + B.COMBINE_SEND_EPOCH)
    par = epoch % 2
    if WEIGHTS_AT_DISPATCH:     # `weights` is dweights: already here, in dispatch's half
        wpar = tl.load(state + B.DISPATCH_RECV_EPOCH) % 2
    else:
        wpar = par
    t0 = trd.begin(TRACE)
    return epoch, par, wpar, t0


@triton.jit
def combine_recv_end(npid, epoch, t0, out, num_tokens, state, ctrl, trace_buf, rank,
                     H: tl.constexpr, BLOCK_H: tl.constexpr, TRACE: tl.constexpr):
    """The end of a receive half, both paths: the RECV trace slice since t0; the last of
    the npid receivers stores the epoch, after leaving out [T, H] all bits set (NaN) if
    a wait of this rank failed (buffers.py "Calls")."""
    trd.end(trace_buf, t0, tags.RECV, rank, TRACE)
    if tdl.last_program_out(state + B.COMBINE_RECV_DONE, npid):
        if B.launch_failed(ctrl):
            B.poison_outputs(out, tl.cast(num_tokens, tl.int64) * H, BLOCK_H)
        tl.store(state + B.COMBINE_RECV_EPOCH, epoch)



@triton.jit
def combine_send(pid, npid, expert_y, stride_ye, stride_yr, topk_weights, stride_wt,
                 stride_wk, num_tokens, send_slot, token_rows, recv_count, weights, partial,
                 flags, fps, slots, state, ctrl, heap_bases, trace_buf, rank, world,
                 max_tokens, cap, num_weight_programs, fp, H: tl.constexpr, K: tl.constexpr,
                 KP: tl.constexpr, WP: tl.constexpr, NS: tl.constexpr, NP: tl.constexpr,
                 WEIGHTS_AT_DISPATCH: tl.constexpr, BLOCK_T: tl.constexpr,
                 BLOCK_H: tl.constexpr, TRACE: tl.constexpr):
    epoch, par, wpar, t0 = combine_send_begin(state, WEIGHTS_AT_DISPATCH, TRACE)
    if pid < num_weight_programs:
        store_weights(pid, topk_weights, stride_wt, stride_wk, num_tokens, send_slot,
                      weights, heap_bases, rank, world, max_tokens, num_weight_programs, par,
                      K, KP, WP, BLOCK_T)
        trd.end(trace_buf, t0, tags.SEND, rank, TRACE)
        B.signal_program(flags, fps, slots, B.FLAG_WEIGHTS, par, world, rank, pid, epoch,
                         fp, heap_bases, NS, WP)
    else:
        q = pid - num_weight_programs
        nq = npid - num_weight_programs
        start = 0
        ok = tl.cast(1, tl.int1)      # no wait of this program failed: it may push
        for j in range(world):
            s = (rank + 1 + j) % world      # programs spread over the links, this rank last
            n = tl.load(recv_count + s)
            i0 = (q - start % nq + nq) % nq
            if not WEIGHTS_AT_DISPATCH:
                if ok & (i0 < n):
                    tw = trd.begin(TRACE)
                    # the same count of weight programs on every rank (plans.py)
                    came, _, theirs = B.wait_programs(flags, fps, slots, B.FLAG_WEIGHTS,
                                                      par, world, s, num_weight_programs,
                                                      epoch, fp, ctrl, rank, B.OP_COMBINE,
                                                      NS, NP)
                    ok = same_call(theirs, fp, came, ctrl, rank, s, B.OP_COMBINE)
                    trd.end(trace_buf, tw, tags.WAIT, rank, TRACE)
            if ok:
                for i in range(i0, n, nq):
                    push_partial(i, s, expert_y, stride_ye, stride_yr, token_rows, weights,
                                 partial, heap_bases, rank, world, max_tokens, cap, par, wpar,
                                 H, KP, BLOCK_H)
            start += n
        trd.end(trace_buf, t0, tags.COMBINE, rank, TRACE)
        # a program whose wait failed signals no peer: their waits stop on its error word
        if ok & (not B.launch_failed(ctrl)):
            B.signal_program(flags, fps, slots, B.FLAG_COMBINE, par, world, rank, q, epoch,
                             fp, heap_bases, NS, WP)


@triton.jit
def combine_recv(pid, npid, out, num_tokens, send_slot, partial, flags, fps, slots, state,
                 ctrl, trace_buf, rank, world, max_tokens, peer_programs, fp,
                 H: tl.constexpr, WP: tl.constexpr, NS: tl.constexpr, NP: tl.constexpr,
                 WEIGHTS_AT_DISPATCH: tl.constexpr, BLOCK_H: tl.constexpr,
                 TRACE: tl.constexpr):
    epoch = tdl.launch_epoch(state + B.COMBINE_RECV_EPOCH)
    par = epoch % 2
    # with the weights at dispatch, a source that sent weights in this launch made the
    # other call (weights at combine: another fingerprint) and waits for ours, which never
    # come; the wait for its partials watches its weights flag (CallMismatch at once)
    WATCH: tl.constexpr = B.FLAG_WEIGHTS if WEIGHTS_AT_DISPATCH else -1
    t0 = trd.begin(TRACE)
    ok = tl.cast(1, tl.int1)
    for j in range(world):
        s = (rank + j) % world
        if ok:
            came, _, theirs = B.wait_programs(flags, fps, slots, B.FLAG_COMBINE, par, world,
                                              s, peer_programs, epoch, fp, ctrl, rank,
                                              B.OP_COMBINE, NS, NP, WATCH)
            ok = same_call(theirs, fp, came, ctrl, rank, s, B.OP_COMBINE)
    trd.end(trace_buf, t0, tags.WAIT, rank, TRACE)
    t0 = trd.begin(TRACE)
    if ok:
        for t in range(pid, num_tokens, npid):
            sum_partials(t, out, send_slot, partial, world, max_tokens, par, H, WP, BLOCK_H)
    trd.end(trace_buf, t0, tags.RECV, rank, TRACE)


@triton.jit
def combine_kernel(expert_y, stride_ye, stride_yr, topk_weights, stride_wt, stride_wk, out,
                   num_tokens, send_slot, token_rows, recv_count, weights, partial, flags,
                   fps, slots, state, ctrl, heap_bases, trace_buf, rank, world, max_tokens,
                   cap, num_weight_programs, send_programs, peer_programs, fp,
                   PART: tl.constexpr, H: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
                   WP: tl.constexpr, NS: tl.constexpr, NP: tl.constexpr,
                   WEIGHTS_AT_DISPATCH: tl.constexpr, BLOCK_T: tl.constexpr,
                   BLOCK_H: tl.constexpr, TRACE: tl.constexpr, PDL: tl.constexpr):
    B.begin_launch(PDL)         # before any global access (buffers.begin_launch)
    pid = tl.program_id(0)
    n_send = B.senders(send_programs, PART)
    if pid < n_send:
        if PART != B.RECV:
            combine_send(pid, n_send, expert_y, stride_ye, stride_yr, topk_weights,
                         stride_wt, stride_wk, num_tokens, send_slot, token_rows, recv_count,
                         weights, partial, flags, fps, slots, state, ctrl, heap_bases,
                         trace_buf, rank, world, max_tokens, cap, num_weight_programs, fp, H,
                         K, KP, WP, NS, NP, WEIGHTS_AT_DISPATCH, BLOCK_T, BLOCK_H, TRACE)
    else:
        if PART != B.SEND:
            combine_recv(pid - n_send, tl.num_programs(0) - n_send, out, num_tokens,
                         send_slot, partial, flags, fps, slots, state, ctrl, trace_buf, rank,
                         world, max_tokens, peer_programs, fp, H, WP, NS, NP,
                         WEIGHTS_AT_DISPATCH, BLOCK_H, TRACE)
    # off the chain, as dispatch's: the last program of the launch stores the epochs and,
    # if a wait of this rank failed, leaves out [T, H] all bits set (buffers.py "Calls")
    done = B.COMBINE_SEND_DONE if PART == B.SEND else B.COMBINE_RECV_DONE
    if tdl.last_program_out(state + done, tl.num_programs(0), SYS=False):
        if PART != B.SEND:
            if B.launch_failed(ctrl):
                B.poison_outputs(out, tl.cast(num_tokens, tl.int64) * H, BLOCK_H)
            tl.store(state + B.COMBINE_RECV_EPOCH, tl.load(state + B.COMBINE_RECV_EPOCH) + 1)
        if PART != B.RECV:
            tl.store(state + B.COMBINE_SEND_EPOCH, tl.load(state + B.COMBINE_SEND_EPOCH) + 1)
