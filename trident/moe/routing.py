"""A token's expert ids, checked on the device as dispatch reads them.

Checking topk_idx on the host costs a device->host synchronisation per dispatch (about
200 us under a profiler), so the send kernel checks each token's ids itself:

  - an id outside [0, num_experts) is dropped. The comparison is made in the ids' own
    dtype, before the cast to int32, so an int64 id such as 2**32 + 1 is never truncated
    into a valid one;
  - an id the token already listed at an earlier position is dropped (the first
    occurrence stays), so a token reaches each expert once.

Dropping keeps every write in bounds whatever the ids are. With `check` on, the first
such problem on this rank is also recorded in the control block (language/sync.py,
CTRL_VALUE_ERROR); ctx.sync() and ctx.barrier() raise it as a ValueError naming the
token, the position and the id (errors.py, VALUE_ERRORS). `check` = CHECK_ALLOW_NONE
(ExpertParallel(allow_minus_one=True), DeepEP's convention) does the same except that an
id of -1 means "no expert": dropped, never recorded.
"""
import triton
import triton.language as tl

from ..runtime.errors import VALUE_ERROR_CODES
from ..language.sync import CTRL_VALUE_ARGS, CTRL_VALUE_ERROR

OUT_OF_RANGE = tl.constexpr(VALUE_ERROR_CODES["expert_id_out_of_range"])
REPEATED = tl.constexpr(VALUE_ERROR_CODES["expert_id_repeated"])
CHECK_ALLOW_NONE = tl.constexpr(2)   # a `check` value: record bad ids; -1 is "no expert"


@triton.jit
def record_value_error(ctrl, kind: tl.constexpr, a, b, c, d):
    """Record a bad input value (kind, four words saying where) unless this rank has one
    recorded already: the CAS from 0 lets exactly one program write the words."""
    # cmp spelled as int64: the interpreter sizes the CAS by cmp's type
    old = tl.atomic_cas(ctrl + CTRL_VALUE_ERROR, tl.full([], 0, tl.int64),
                        tl.full([], kind, tl.int64), sem="relaxed", scope="gpu")
    if old == 0:                # tl.store casts each value to int64
        tl.store(ctrl + CTRL_VALUE_ARGS, a)
        tl.store(ctrl + CTRL_VALUE_ARGS + 1, b)
        tl.store(ctrl + CTRL_VALUE_ARGS + 2, c)
        tl.store(ctrl + CTRL_VALUE_ARGS + 3, d)


@triton.jit
def expert_ids(topk_idx, t, stride_it, stride_ik, num_experts, ctrl, check,
               K: tl.constexpr, KP: tl.constexpr):
    """Token t's expert ids as int32 [KP]: -1 for padding and for dropped ids (see above)."""
    ks = tl.arange(0, KP)
    listed = ks < K
    raw = tl.load(topk_idx + t * stride_it + ks * stride_ik, mask=listed, other=0)
    bad = listed & ((raw < 0) | (raw >= num_experts))   # in the ids' dtype: no truncation
    e = tl.where(listed & ~bad, raw, -1).to(tl.int32)
    # first[j]: the first position i < j holding the same valid id as j, else KP
    same = (e[:, None] == e[None, :]) & (ks[:, None] < ks[None, :]) & (e[None, :] >= 0)
    first = tl.min(tl.where(same, ks[:, None], KP), axis=0)
    repeated = first < KP
    if check != 0:
        flagged = bad & ((raw != -1) | (check != CHECK_ALLOW_NONE))
        j_bad = tl.min(tl.where(flagged, ks, KP))
        j_rep = tl.min(tl.where(repeated, ks, KP))
        j = tl.minimum(j_bad, j_rep)
        if j < KP:
            value = tl.sum(tl.where(ks == j, raw.to(tl.int64), 0))
            if j_bad < j_rep:
                record_value_error(ctrl, OUT_OF_RANGE, t, j, value, num_experts)
            else:
                i = tl.sum(tl.where(ks == j, first, 0))
                record_value_error(ctrl, REPEATED, t, j, value, i)
    return tl.where(repeated, -1, e)
