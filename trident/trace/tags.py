"""Names of traced phases. Kernels pass one of these constants as `tag` to trace.end.
Append only; the exporter turns the numbers back into these names."""
import triton.language as tl

SEND = tl.constexpr(1)      # pushing data to peers
WAIT = tl.constexpr(2)      # waiting for a peer's flag
COPY = tl.constexpr(3)      # local copy (staging in or out of the heap)
REDUCE = tl.constexpr(4)    # reduction of peer contributions
GEMM_TILE = tl.constexpr(5) # one output tile of a GEMM
FETCH = tl.constexpr(6)     # pulling a tile / rows from a peer
DISPATCH = tl.constexpr(7)  # MoE dispatch (send half)
COMBINE = tl.constexpr(8)   # MoE combine (send half)
RECV = tl.constexpr(9)      # receive half of a split op
BARRIER = tl.constexpr(10)  # cross-rank barrier
KERNEL = tl.constexpr(11)   # a whole program, start to end

NAMES = {1: "send", 2: "wait", 3: "copy", 4: "reduce", 5: "gemm_tile", 6: "fetch",
         7: "dispatch", 8: "combine", 9: "recv", 10: "barrier", 11: "kernel"}


def name(tag: int) -> str:
    """Readable name of a tag number (unknown numbers stay visible as "tag N")."""
    return NAMES.get(int(tag), f"tag {int(tag)}")
