"""The LL unit format of the Lamport protocol (ccl/lamport.py), for the algorithms that move
any dtype (all_gather, broadcast and all_to_all `lamport`).

LL units (all_gather/, broadcast/ and all_to_all/lamport.py: `LL_OPS`). Data of any dtype
leaves no value free for a sentinel, so these send LL units instead (NCCL's LL protocol:
`pack`, `ll_units`, `receive_ll`, `unpack`): each 8-byte word of a buffer is one unit, 4
bytes of payload in its low half and the round's flag (`ll_flag`: the epoch mod 2^31,
never negative) in its high half -- in memory [payload, flag], a thread's two
units [data0, flag, data1, flag], sent with one 16-byte st.v2.b64 and polled with one
ld.volatile.v2.b64 (tests/compile/sm90.py checks both). A naturally aligned 8-byte access
is single-copy atomic, so a receiver that sees this round's flag in a unit sees the
payload that was stored with it; nothing relies on the 16 bytes arriving together. Half
of the bytes on the wire are flags, which small messages do not miss.
Why a stale unit never passes for this round's: units live in the same buffers and rounds
as the sentinel words (`data` viewed as int64), and a receiver clears every unit it read
back to the fill, 0x8000800080008000 -- the sentinel in every half, so the buffer is again
what the sentinel kernels expect, and a negative flag, which no round has. Every unit a
peer wrote into buffer e % 3 in an earlier round was read and cleared by this rank in that
round (both made the same call; else their heads differ: CallMismatch, and ctx.reset()
refills). So in round e a unit of buffer e % 3 holds the fill or round e's data, and only
the latter carries ll_flag(e). Hence the wrap of flags at 2^31 rounds is harmless: no unit
outlives its round, so no older flag is there to be taken for a newer one.
"""
import triton
import triton.language as tl


@triton.jit
def ll_flag(epoch):
    """The flag word of round `epoch`'s LL units: never negative, so never the fill's."""
    return (epoch & 0x7FFFFFFF).to(tl.int32)


@triton.jit
def ll_units(lanes, flag):
    """LL units of the int32 payload `lanes`: (flag << 32) | lane, each one 8-byte word."""
    return (tl.cast(flag, tl.int64) << 32) | (lanes.to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def pack(words, offs, count, WORD: tl.constexpr):
    """Lanes `offs` (4 bytes each, an LL unit's payload) of the `count` words of WORD bytes
    at `words`, as int32 (past the end: zeros): any dtype, as common.as_words' words."""
    if WORD == 4:
        lanes = tl.load(words + offs, mask=offs < count, other=0)
    else:
        lanes = tl.zeros_like(offs)
        for k in tl.static_range(4 // WORD):
            idx = offs * (4 // WORD) + k
            part = tl.load(words + idx, mask=idx < count, other=0).to(tl.int32)
            lanes = lanes | ((part & ((1 << (8 * WORD)) - 1)) << (8 * WORD * k))
    return lanes


@triton.jit
def unpack(words, lanes, offs, count, WORD: tl.constexpr):
    """Store lanes `offs` into the `count` words of WORD bytes at `words` (pack's inverse)."""
    if WORD == 4:
        tl.store(words + offs, lanes, mask=offs < count)
    else:
        for k in tl.static_range(4 // WORD):
            idx = offs * (4 // WORD) + k
            tl.store(words + idx, (lanes >> (8 * WORD * k)).to(words.dtype.element_ty),
                     mask=idx < count)
