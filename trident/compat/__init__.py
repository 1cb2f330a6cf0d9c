"""Other libraries' Python APIs, backed by trident, for programs written against them.

    from trident.compat import deep_ep     # instead of `import deep_ep` (one node)

deep_ep: DeepEP's intranode `Buffer` (low-latency and normal modes) over
trident.ExpertParallel and trident's all_to_all; see docs/deep-ep.md.
"""
