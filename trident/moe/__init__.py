"""MoE expert-parallel dispatch and combine (see expert_parallel.py for the API,
dispatch.py / combine.py for the kernels, buffers.py for the buffer layout)."""
from .expert_parallel import Dispatched, ExpertParallel, PendingCombine, PendingDispatch

__all__ = ["ExpertParallel", "Dispatched", "PendingDispatch", "PendingCombine"]
