"""GEMMs fused with communication: all_gather_matmul (column-parallel linear),
matmul_reduce_scatter and matmul_all_reduce (row-parallel linear).

Each takes (ctx, a, w, bias=None, out=None, schedule="auto"); w is laid out like
nn.Linear.weight ([out_features, in_features]). The schedules -- "fused", "sequential",
"epilogue", "pipelined", "async_tp" (torch's; not matmul_all_reduce), "plain" -- are
registered in schedules.py; "auto" picks one per
op, world size, M bucket and size class, eager or graph (auto.py: tuned table, built-in
table, measured crossovers, cost model). `algorithm=` is the older name of schedule=.
matmul_all_reduce_add_rmsnorm: matmul_all_reduce, then the residual add and RMSNorm, in
one kernel at decode sizes (its own schedules: matmul_all_reduce_add_rmsnorm.py).
"""
from .all_gather_matmul import all_gather_matmul
from .matmul_all_reduce import matmul_all_reduce
from .matmul_all_reduce_add_rmsnorm import matmul_all_reduce_add_rmsnorm
from .matmul_reduce_scatter import matmul_reduce_scatter

__all__ = ["all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce",
           "matmul_all_reduce_add_rmsnorm"]
