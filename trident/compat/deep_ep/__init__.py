"""DeepEP's Python API for the ranks of one node, backed by trident.

    from trident.compat import deep_ep     # instead of `import deep_ep`

deep_ep.Buffer (low-latency and normal modes), deep_ep.EventOverlap, deep_ep.Config and
deep_ep.topk_idx_t, with DeepEP's signatures, shapes, dtypes and layouts. What trident
cannot do the same (RDMA, internode, LogFMT, UE8M0 scales, rank masking, ...) raises
NotImplementedError naming DeepEP's argument. docs/deep-ep.md says what is supported.
"""
from .buffer import Buffer, topk_idx_t
from .events import Config, EventHandle, EventOverlap

__all__ = ["Buffer", "Config", "EventHandle", "EventOverlap", "topk_idx_t"]
