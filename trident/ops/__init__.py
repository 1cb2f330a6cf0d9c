"""GEMMs fused with communication: all_gather_matmul (column-parallel linear),
matmul_reduce_scatter and matmul_all_reduce (row-parallel linear).

Each takes (ctx, a, w, bias=None, out=None, algorithm="auto"); w is laid out like
nn.Linear.weight ([out_features, in_features]). "auto" lets the selector (selector.py)
pick trident's fused kernel or NCCL + cuBLAS from measured crossovers.
"""
from .all_gather_matmul import all_gather_matmul
from .matmul_all_reduce import matmul_all_reduce
from .matmul_reduce_scatter import matmul_reduce_scatter

__all__ = ["all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce"]
