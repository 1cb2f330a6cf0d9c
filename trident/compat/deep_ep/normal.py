"""DeepEP's normal mode (Buffer.get_dispatch_layout / dispatch / combine), one node, over
trident's all_to_all.

DeepEP's normal dispatch sends each token once to every rank owning one of its experts
and returns what a rank received as one list, not per expert: recv_x [N, H] grouped by
source rank in rank order (handle[0], the rank prefix matrix, says where each source's
rows end), each source's tokens in their order there; recv_topk_idx [N, k] int64 (the
local expert, -1 where the expert lives on another rank), recv_topk_weights [N, k] fp32
(0 where -1), the tokens per local expert as a Python list, and the handle. combine sends
every received row back and sums each token's rows over the ranks it went to (no
weights; the experts' weighting is the caller's), plus bias.

How: how many rows each rank sends to each is exchanged in one small all_gather of the
layout and read on the host (DeepEP's normal dispatch waits for its counts on the CPU as
well, unless num_worst_tokens). Each token's row -- its data, top-k ids and weights and
its index -- is packed into a heap buffer of R slots of C rows (C: the largest count of
any pair of ranks, rounded up to a power of two, so the same on every rank) and moved by
one trident all_to_all with even splits; combine moves rows back through the same two
buffers. Their addresses stay fixed, so the all_to_all's launch plan is made once per
(C, row size) and changing counts do not churn the plan cache.

Why not ExpertParallel: its outputs are per expert ([L, R * M, H], too large for
prefill batches) and its rows come in arrival order, not DeepEP's.
"""
from __future__ import annotations

import math
import zlib

import torch

from .events import event_for, refuse, wait_previous

ROW_ALIGN = 16        # bytes: a packed row is a whole number of 16-byte vectors


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _per_row(t: torch.Tensor) -> int:
    return math.prod(t.shape[1:])


def _row_bytes(fields) -> int:
    """Bytes of a packed row of `fields` (a multiple of ROW_ALIGN)."""
    n = sum(_per_row(f) * f.element_size() for f in fields)
    return n + -n % ROW_ALIGN


def _pack(fields, n: int) -> torch.Tensor:
    """The fields' rows side by side as bytes [n, W] (W = _row_bytes(fields))."""
    out = torch.empty(n, _row_bytes(fields), dtype=torch.uint8, device=fields[0].device)
    off = 0
    for f in fields:
        nb = _per_row(f) * f.element_size()
        if n:
            out[:, off:off + nb] = f.reshape(n, _per_row(f)).contiguous().view(torch.uint8)
        off += nb
    out[:, off:] = 0
    return out


def _unpack(rows: torch.Tensor, specs) -> list:
    """Split byte rows [n, W] into tensors, one per (dtype, shape after dim 0) in specs."""
    n, out, off = rows.shape[0], [], 0
    for dtype, tail in specs:
        nb = math.prod(tail) * torch.empty((), dtype=dtype).element_size()
        out.append(rows[:, off:off + nb].contiguous().view(dtype).reshape(n, *tail))
        off += nb
    return out


def _ranges(counts, cap: int, device) -> torch.Tensor:
    """Rows [s * cap, s * cap + counts[s]) for every s, in order (int64 on device)."""
    parts = [torch.arange(s * cap, s * cap + c) for s, c in enumerate(counts) if c]
    idx = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
    return idx.to(device)


class NormalHandle:
    """What dispatch returns as `handle` (for combine and for a cached dispatch). Of
    DeepEP's handle (rank_prefix_matrix, channel_prefix_matrix, recv_channel_prefix_matrix,
    recv_src_idx, is_token_in_rank, send_head), items 0, 3 and 4 are here; 1, 2 and 5
    describe DeepEP's channels, which do not exist here, and raise NotImplementedError."""
    __slots__ = ("rank_prefix_matrix", "recv_src_idx", "is_token_in_rank", "num_tokens",
                 "cap", "send_counts", "recv_counts", "send_tokens", "send_rows", "recv_rows")

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i):
        got = {0: self.rank_prefix_matrix, 3: self.recv_src_idx, 4: self.is_token_in_rank}
        if i < 0:
            i += 6
        if i in got:
            return got[i]
        if i in (1, 2, 5):
            refuse(f"handle[{i}] (DeepEP's channel prefix matrices / send_head)",
                   "trident's normal mode has no channels; pass the handle to combine")
        raise IndexError(f"handle index {i} out of range (6 items)")

    @property
    def num_recv(self) -> int:
        return sum(self.recv_counts)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _counts(t, name: str, shape: str) -> None:
    """A count input of dispatch (num_tokens_per_rank, num_tokens_per_expert): an int32
    or int64 tensor of one dimension."""
    got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
    _check(isinstance(t, torch.Tensor) and t.dim() == 1
           and t.dtype in (torch.int32, torch.int64),
           f"dispatch: {name} must be an int32 (or int64) tensor [{shape}] "
           f"(get_dispatch_layout gives it), got {got}")


def _specs(fields) -> tuple:
    """What the ranks must agree on about the rows they move: (dtype, shape after dim 0)
    of each field."""
    return tuple((f.dtype, tuple(f.shape[1:])) for f in fields)


def _describe(specs, names) -> str:
    """The specs of the fields called `names` (the rest: dispatch's own), for messages."""
    return ", ".join(f"{n} {str(d).removeprefix('torch.')} [n, {', '.join(map(str, t))}]"
                     for n, (d, t) in zip(names, specs))


_DIGESTS: dict = {}     # specs -> int64 digest (the dispatch layout carries it)


def _digest(specs) -> int:
    d = _DIGESTS.get(specs)
    if d is None:
        d = _DIGESTS[specs] = zlib.crc32(repr(specs).encode())
    return d


class NormalMethods:
    """Buffer's normal-mode calls (a mixin of buffer.Buffer: ctx, group_size, rank, _cuda,
    _stage, _gather_bufs, _agreed, _last_agreed, _destroyed)."""

    def get_dispatch_layout(self, topk_idx, num_experts: int, previous_event=None,
                            async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """(num_tokens_per_rank [R] int32, None, num_tokens_per_expert [E] int32,
        is_token_in_rank [T, R] bool, event) of topk_idx [T, k] (-1: no expert); local."""
        if self.ctx is None:
            raise self._destroyed("get_dispatch_layout")
        R = self.group_size
        _check(isinstance(topk_idx, torch.Tensor) and topk_idx.dim() == 2
               and topk_idx.dtype in (torch.int64, torch.int32),
               "get_dispatch_layout: topk_idx must be a [num_tokens, num_topk] int64 tensor")
        _check(isinstance(num_experts, int) and num_experts > 0 and num_experts % R == 0,
               f"get_dispatch_layout: num_experts must be a positive multiple of the "
               f"{R} ranks, got {num_experts!r}")
        wait_previous(previous_event)
        T, L, dev = topk_idx.shape[0], num_experts // R, topk_idx.device
        valid = (topk_idx >= 0) & (topk_idx < num_experts)
        ids = torch.where(valid, topk_idx, num_experts).long()
        per_expert = torch.bincount(ids.flatten(), minlength=num_experts + 1)[:num_experts]
        ranks = torch.where(valid, topk_idx // L, R).long()
        in_rank = torch.zeros(T, R + 1, dtype=torch.bool, device=dev).scatter_(1, ranks, True)
        in_rank = in_rank[:, :R].contiguous()
        return (in_rank.sum(0, dtype=torch.int32), None, per_expert.to(torch.int32), in_rank,
                event_for(async_finish, self._cuda))

    # ------------------------------------------------------------------ agreement
    def _agree(self, op: str, what: str, detail: str) -> None:
        """Meet the peers in a host exchange published as a host call (ctx.host_call) and
        raise ValueError on every rank where their `detail`s of call `op` differ, naming
        each rank's. A peer already in the call's kernels (its inputs agreed before) stops
        at once there, and every rank raises CallMismatch naming both calls."""
        theirs = self.ctx.host_call(f"deep_ep {op}", detail)
        if theirs is not None:
            lines = "; ".join(f"rank {r}: {d}" for r, d in enumerate(theirs))
            raise ValueError(f"{op}: the ranks passed different {what} ({lines}); every "
                             f"rank must pass the same (as in DeepEP)")

    def _agree_once(self, op: str, key: tuple, what: str, describe) -> None:
        """_agree(op, what, describe()) the first time this Buffer meets `key` (its first
        item: the kind of input); a set lookup after. Not ctx.agree_once: its exchange is
        not a published host call, so a peer whose key was agreed before waited for this
        rank in the call's kernel, and this rank in the exchange, each until its timeout.
        The detail names the last key of its kind agreed (the same on every rank): what
        such a peer passed, most likely."""
        if key not in self._agreed:
            detail = describe()
            last = self._last_agreed.get(key[0])
            self._agree(op, what, detail if last is None else
                        f"{detail}, new on this rank (the last agreed: {last})")
            self._agreed.add(key)
            self._last_agreed[key[0]] = detail

    # ------------------------------------------------------------------ the exchange
    def _staging(self, words: int):
        """The two heap buffers (int32 words), grown to `words` each (collective: every
        rank grows at the same call, since C and the rows' fields are agreed: the layout
        exchange of a dispatch, _agree_once of a cached dispatch and of combine)."""
        if self._stage is None or self._stage[0].numel() < words:
            if self._stage is not None:
                self.ctx.barrier()           # no peer still writes into the old ones
                for t in self._stage:
                    self.ctx.free(t)
            self._stage = (self.ctx.empty(words, dtype=torch.int32),
                           self.ctx.empty(words, dtype=torch.int32))
        return self._stage

    def _move(self, h: NormalHandle, packed: torch.Tensor, forward: bool) -> torch.Tensor:
        """Dispatch (forward): packed [S, W] rows in send order -> the rows received, in
        (source rank, order) order. Combine: packed rows in that order -> the rows back,
        in send order."""
        R, C, W = self.group_size, h.cap, packed.shape[1]
        words = R * C * W // 4
        a, b = self._staging(words)
        src, dst = (a, b) if forward else (b, a)
        src = src[:words].view(R * C, W // 4)
        dst = dst[:words].view(R * C, W // 4)
        place, take = (h.send_rows, h.recv_rows) if forward else (h.recv_rows, h.send_rows)
        src.view(torch.uint8).index_copy_(0, place, packed)
        self.ctx.all_to_all(dst, src)
        return dst.view(torch.uint8).index_select(0, take)

    def _gather(self, info: torch.Tensor) -> list:
        """Every rank's `info` (int64 [V]) on the host, through persistent heap buffers."""
        V = info.numel()
        bufs = self._gather_bufs.get(V)
        made = bufs is None
        if made:
            bufs = (self.ctx.zeros(V, dtype=torch.int64),
                    self.ctx.zeros(self.group_size * V, dtype=torch.int64))
        try:
            bufs[0].copy_(info)
            self.ctx.all_gather(bufs[1], bufs[0])
            rows = bufs[1].view(self.group_size, V).tolist()    # waits for the gather
            # a peer's failure left the rows poisoned (all bits set): raise it rather than
            # read them as counts
            self.ctx.raise_if_failed("dispatch")
        except BaseException:
            if made:         # a peer that refused its call made none: the heaps stay alike
                for t in reversed(bufs):
                    self.ctx.free(t)
            raise
        self._gather_bufs[V] = bufs
        return rows

    def _layout(self, in_rank, per_rank, per_expert, topk_idx, specs, names,
                worst: int) -> tuple[NormalHandle, list]:
        """The handle of a dispatch and the tokens per local expert received (summed over
        the sources' num_tokens_per_expert). One all_gather, read on the host; every
        rank checks every rank's inputs, so all raise the same error together. The
        number of experts is agreed first (once per Buffer and number: it sizes the
        all_gather)."""
        R, me, dev = self.group_size, self.rank, in_rank.device
        E = per_expert.numel()
        self._agree_once("dispatch", ("experts", E), "num_tokens_per_expert sizes",
                         lambda: f"num_tokens_per_expert [{E}] (num_experts = {E})")
        counts = in_rank.sum(0)
        per_expert = per_expert.to(torch.int64)
        flags = [(counts != per_rank.to(counts.dtype)).any()]
        if topk_idx is not None:
            ids = topk_idx.flatten().to(torch.int64)
            valid = (ids >= 0) & (ids < E)
            flags.append((~valid & (ids != -1)).any())
            # num_tokens_per_expert: exactly the entries of each expert (no bincount: it
            # reads the largest id on the host)
            want = torch.zeros(E + 1, dtype=torch.int64, device=dev).scatter_add_(
                0, torch.where(valid, ids, E), torch.ones_like(ids))[:E]
            flags.append((want != per_expert).any())
        else:
            flags.append(torch.zeros((), dtype=torch.bool, device=dev))
            # without top-k: each rank's experts hold every token sent there, at least
            # once, and none where none goes
            held = per_expert.reshape(R, E // R).sum(1)
            flags.append((per_expert < 0).any() | (held < counts).any()
                         | ((counts == 0) & (held != 0)).any())
        facts = torch.tensor([_digest(specs), worst], dtype=torch.int64)
        info = torch.cat([counts, per_expert, torch.stack(flags).to(torch.int64),
                          facts.to(dev)])
        rows = self._gather(info)
        for s, row in enumerate(rows):
            _check(not row[R + E], f"dispatch: rank {s}'s num_tokens_per_rank differs from "
                   f"its is_token_in_rank (pass get_dispatch_layout's outputs)")
            _check(not row[R + E + 1], f"dispatch: rank {s}'s topk_idx holds ids outside "
                   f"[-1, {E}) (num_experts = {E}: num_tokens_per_expert's length)")
            _check(not row[R + E + 2], f"dispatch: rank {s}'s num_tokens_per_expert does "
                   f"not match its routing: expected " + (
                       "each expert's number of entries in topk_idx" if topk_idx is not None
                       else "each rank's experts to hold at least the tokens "
                            "is_token_in_rank sends there, and none where it sends none")
                   + " (pass get_dispatch_layout's outputs)")
        if any(row[R + E + 3] != rows[0][R + E + 3] for row in rows):
            what = "hidden sizes, dtypes or top-k"
            self._agree("dispatch", what, _describe(specs, names))   # names them
            raise ValueError(f"dispatch: the ranks passed different {what}")
        for s, row in enumerate(rows):
            got = sum(r[s] for r in rows)
            _check(not row[-1] or got <= row[-1], f"dispatch: rank {s} receives {got} "
                   f"tokens, more than its num_worst_tokens = {row[-1]}")
        h = NormalHandle()
        matrix = [row[:R] for row in rows]
        h.cap = _pow2(max(1, max(max(m) for m in matrix)))
        h.send_counts, h.recv_counts = matrix[me], [m[me] for m in matrix]
        h.send_rows = _ranges(h.send_counts, h.cap, dev)
        h.recv_rows = _ranges(h.recv_counts, h.cap, dev)
        h.send_tokens = in_rank.t().nonzero()[:, 1]        # (rank, token) in that order
        h.num_tokens, h.is_token_in_rank = in_rank.shape[0], in_rank
        h.rank_prefix_matrix = torch.tensor(matrix, dtype=torch.int32).cumsum(0).to(
            torch.int32).to(dev)
        L = E // R
        experts = [sum(row[R + me * L + j] for row in rows) for j in range(L)]
        return h, experts

    # ------------------------------------------------------------------ dispatch
    def _dispatch_inputs(self, x, handle, num_tokens_per_rank, num_tokens_per_rdma_rank,
                         is_token_in_rank, num_tokens_per_expert, topk_idx, topk_weights,
                         expert_alignment, previous_event) -> list:
        """dispatch's checks of this rank's own inputs, made before any exchange: the
        fields to move (x's, then top-k ids, weights and token index). Raises
        ValueError/TypeError/NotImplementedError, which dispatch hands to the peers."""
        if num_tokens_per_rdma_rank is not None:
            refuse("num_tokens_per_rdma_rank", "internode (RDMA) dispatch; "
                   "trident.compat.deep_ep is intranode")
        if self.ctx.capturing():
            refuse("dispatch under CUDA graph capture", "the normal mode reads the counts "
                   "on the host (use the low-latency calls in graphs)")
        fields = list(x) if isinstance(x, tuple) else [x]
        _check_x(fields)
        T = fields[0].shape[0]
        wait_previous(previous_event)
        if handle is not None:
            if not isinstance(handle, NormalHandle):
                raise TypeError(f"dispatch: handle must be what dispatch returned, got "
                                f"{type(handle).__name__}")
            _check(topk_idx is None and topk_weights is None, "dispatch: a cached dispatch "
                   "(handle given) takes no topk_idx / topk_weights (as DeepEP)")
            _check(T == handle.num_tokens, f"dispatch: x has {T} tokens, the handle's "
                   f"dispatch had {handle.num_tokens}")
            return fields
        _check(num_tokens_per_rank is not None and is_token_in_rank is not None
               and num_tokens_per_expert is not None, "dispatch: num_tokens_per_rank, "
               "is_token_in_rank and num_tokens_per_expert are needed without a handle "
               "(get_dispatch_layout gives them)")
        R = self.group_size
        _check(isinstance(is_token_in_rank, torch.Tensor) and is_token_in_rank.dtype ==
               torch.bool and tuple(is_token_in_rank.shape) == (T, R),
               f"dispatch: is_token_in_rank must be a [{T}, {R}] bool tensor")
        _counts(num_tokens_per_rank, "num_tokens_per_rank", f"num_ranks = {R}")
        _check(num_tokens_per_rank.shape[0] == R,
               f"dispatch: num_tokens_per_rank must be [{R}], got "
               f"[{num_tokens_per_rank.shape[0]}]")
        _counts(num_tokens_per_expert, "num_tokens_per_expert", "num_experts")
        E = num_tokens_per_expert.numel()
        _check(E > 0 and E % R == 0, f"dispatch: num_tokens_per_expert must be "
               f"[num_experts], a multiple of {R} ranks, got [{E}]")
        _check((topk_idx is None) == (topk_weights is None),
               "dispatch: pass topk_idx and topk_weights together (as DeepEP)")
        _check(isinstance(expert_alignment, int) and expert_alignment >= 1,
               f"dispatch: expert_alignment must be a positive int, got {expert_alignment!r}")
        if topk_idx is not None:
            _check(topk_idx.dim() == 2 and topk_idx.shape[0] == T and topk_idx.dtype in
                   (torch.int64, torch.int32), f"dispatch: topk_idx must be [{T}, num_topk] "
                   f"int64")
            _check(tuple(topk_weights.shape) == tuple(topk_idx.shape) and
                   topk_weights.dtype == torch.float32, "dispatch: topk_weights must be "
                   "float32 and shaped like topk_idx")
            index = torch.arange(T, dtype=torch.int32, device=fields[0].device)
            fields += [topk_idx.to(torch.int32), topk_weights, index]
        else:
            fields.append(torch.arange(T, dtype=torch.int32, device=fields[0].device))
        return fields

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None,
                 topk_weights=None, expert_alignment: int = 1, num_worst_tokens: int = 0,
                 config=None, previous_event=None, async_finish: bool = False,
                 allocate_on_comm_stream: bool = False):
        """DeepEP's intranode dispatch. Returns (recv_x, recv_topk_idx, recv_topk_weights,
        num_recv_tokens_per_expert_list, handle, event); x is [T, H] or, for FP8, a tuple
        (e4m3 [T, H], fp32 scales [T, H / 128]), received as the same kind."""
        if self.ctx is None:
            raise self._destroyed("dispatch")
        try:      # refused on this rank: its peers stop at once naming it (fail_call)
            fields = self._dispatch_inputs(x, handle, num_tokens_per_rank,
                                           num_tokens_per_rdma_rank, is_token_in_rank,
                                           num_tokens_per_expert, topk_idx, topk_weights,
                                           expert_alignment, previous_event)
        except (TypeError, ValueError, NotImplementedError) as exc:
            raise self.ctx.fail_call("dispatch", exc) from None
        specs = _specs(fields)
        names = ("x", "x scales")[:2 if isinstance(x, tuple) else 1]
        if handle is not None:
            self._agree_once("dispatch", ("cached", specs), "hidden sizes or dtypes",
                             lambda: "a cached dispatch of " + _describe(specs, names))
            got = self._receive(handle, fields, specs, num_worst_tokens)
            return _as_x(got, fields), None, None, None, handle, \
                event_for(async_finish, self._cuda)
        R = self.group_size
        E = num_tokens_per_expert.numel()
        if topk_idx is not None:
            names += ("topk_idx", "topk_weights")
        h, experts = self._layout(is_token_in_rank, num_tokens_per_rank, num_tokens_per_expert,
                                  topk_idx, specs, names, num_worst_tokens)
        got = self._receive(h, fields, specs, num_worst_tokens)
        h.recv_src_idx = got[-1][:h.num_recv]
        recv_idx = recv_w = None
        if topk_idx is not None:
            L, lo = E // R, self.rank * (E // R)
            g = got[-3].to(torch.int64)
            local = (g >= lo) & (g < lo + L)
            recv_idx = torch.where(local, g - lo, -1)
            recv_w = torch.where(local, got[-2], 0.0)
        n_x = 2 if isinstance(x, tuple) else 1
        per_expert = [] if num_worst_tokens else \
            [-(-c // expert_alignment) * expert_alignment for c in experts]
        return _as_x(got[:n_x], got[:n_x]), recv_idx, recv_w, per_expert, h, \
            event_for(async_finish, self._cuda)

    def _receive(self, h: NormalHandle, fields, specs, worst: int) -> list:
        """Move every token's fields (`specs`: _specs(fields)) to the ranks in its
        is_token_in_rank row; the received rows per field, padded to `worst` rows (ids -1,
        the rest 0) if worst."""
        packed = _pack(fields, h.num_tokens).index_select(0, h.send_tokens)
        got = _unpack(self._move(h, packed, forward=True), specs)
        if worst:
            n = got[0].shape[0]
            padded = []
            for t in got:
                full = torch.zeros(worst, *t.shape[1:], dtype=t.dtype, device=t.device)
                full[:n] = t
                padded.append(full)
            if len(got) >= 4:               # with top-k: ids -1 in the padding
                padded[-3][n:] = -1
            got = padded
        return got

    # ------------------------------------------------------------------ combine
    def combine(self, x, handle, topk_weights=None, bias=None, config=None,
                previous_event=None, async_finish: bool = False,
                allocate_on_comm_stream: bool = False):
        """DeepEP's intranode combine: x [N, H] (rows as dispatch received them) goes back;
        combined_x[t] = the sum over the ranks token t went to of their row (+ bias), and
        with topk_weights [N, k], their sum likewise. Returns (combined_x,
        combined_topk_weights or None, event)."""
        if self.ctx is None:
            raise self._destroyed("combine")
        try:      # refused on this rank: its peers stop at once naming it (fail_call)
            if not isinstance(handle, NormalHandle):
                raise TypeError(f"combine: handle must be what dispatch returned, got "
                                f"{type(handle).__name__}")
            wait_previous(previous_event)
            N, T = handle.num_recv, handle.num_tokens
            _check(isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[0] >= N,
                   f"combine: x must be [num_recv_tokens = {N}, hidden]")
            fields = [x[:N]]
            if topk_weights is not None:
                _check(isinstance(topk_weights, torch.Tensor) and topk_weights.dim() == 2
                       and topk_weights.shape[0] >= N and topk_weights.dtype == torch.float32,
                       f"combine: topk_weights must be float32 [{N}, num_topk]")
                fields.append(topk_weights[:N])
        except (TypeError, ValueError) as exc:
            raise self.ctx.fail_call("combine", exc) from None
        specs = _specs(fields)
        # the rows' size and dtypes: equal on every rank, or the staging buffers grow on
        # some ranks only and the others read bytes of another dtype
        self._agree_once("combine", ("combine", specs), "hidden sizes or dtypes",
                         lambda: _describe(specs, ("x", "topk_weights")))
        back = _unpack(self._move(handle, _pack(fields, N), forward=False), specs)
        sums = []
        for v in back:
            acc = torch.zeros(T, *v.shape[1:], dtype=torch.float32, device=v.device)
            start = 0
            for c in handle.send_counts:    # rank by rank: each token once per rank
                if c:
                    acc.index_add_(0, handle.send_tokens[start:start + c],
                                   v[start:start + c].float())
                start += c
            sums.append(acc)
        for b in _biases(bias, T, x.shape[1]):
            sums[0] += b.float()
        combined_w = sums[1] if topk_weights is not None else None
        return sums[0].to(x.dtype), combined_w, event_for(async_finish, self._cuda)


def _check_x(fields) -> None:
    x = fields[0]
    _check(isinstance(x, torch.Tensor) and x.dim() == 2,
           "dispatch: x must be a [num_tokens, hidden] tensor or a tuple (e4m3 "
           "[num_tokens, hidden], fp32 scales [num_tokens, hidden / 128])")
    if len(fields) > 1:
        s = fields[1]
        _check(len(fields) == 2 and x.dtype == torch.float8_e4m3fn and isinstance(s, torch.Tensor)
               and s.dim() == 2 and s.shape[0] == x.shape[0] and s.dtype == torch.float32,
               "dispatch: an FP8 x is a tuple (float8_e4m3fn [num_tokens, hidden], float32 "
               "scales [num_tokens, hidden / 128])")


def _as_x(got, like):
    """recv_x as DeepEP returns it: a tensor, or (e4m3, scales) for a tuple x."""
    return (got[0], got[1]) if len(like) == 2 else got[0]


def _biases(bias, T: int, H: int):
    bs = [] if bias is None else list(bias) if isinstance(bias, tuple) else [bias]
    for b in bs:
        _check(isinstance(b, torch.Tensor) and tuple(b.shape) == (T, H),
               f"combine: bias must be [{T}, {H}] (a tensor or a tuple of two)")
    return bs
