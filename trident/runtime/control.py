"""The layout of each rank's control block: int64 words, the first allocation of the heap,
that the device waits and the host both read and write (trident/language/sync.py makes
tl.constexpr copies of these for kernels; context_sync.py reads them on the host).
"""
CTRL_ERROR = 0          # 0, or the first timeout's encode_timeout(...)
CTRL_TIMEOUT = 1        # wait limit in ns
CTRL_EPOCH = 2          # device-barrier epoch of this rank
# The host-side call (barrier, close, a workspace's creation) this rank is in, its device
# work finished: 0, or (n + 1) << 8 | the call's code (errors.py HOST_CALLS), n being the
# number of host exchanges the rank had completed before it; and that number as of the
# rank's last such call (language/sync.py: "A peer in a host-side call").
CTRL_HOST_CALL = 3
CTRL_HOST_DONE = 4
CTRL_FLAGS = 8          # device-barrier flags, one per source rank
MAX_RANKS = 64
# The first bad input value a kernel found (e.g. an MoE expert id out of range): a kind
# (errors.py VALUE_ERRORS) set by a CAS from 0, then four words that say where. Bad values
# are dropped by the kernel; the host raises ValueError at the next sync.
CTRL_VALUE_ERROR = 8 + 64
CTRL_VALUE_ARGS = 8 + 64 + 1
CTRL_FAILED = 8 + 64 + 5        # errors this rank raised on the host since reset
CTRL_HOST_WORD = 8 + 64 + 6     # address of the host's mirror of CTRL_ERROR
CTRL_BASES = 8 + 64 + 8         # heap base of every rank, in this process
CTRL_TEXT = 8 + 64 + 8 + 64     # the last host error's message (512 bytes)
CTRL_TEXT_WORDS = 64
CTRL_WORDS = 8 + 64 + 8 + 64 + 64
