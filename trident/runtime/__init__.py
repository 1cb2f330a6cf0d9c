"""The runtime: what every family of trident (language, ccl, ops, moe, nodes, ...) stands
on. It imports none of them (tests/test_layers.py).

Read in this order:
  options.py         every environment variable trident reads, declared once; a
                     Context's snapshot of them (ctx.options)
  _env.py            process-wide settings fixed before any kernel is defined: GPU or
                     the CPU emulation (Triton's interpreter), NVLink multicast off
  errors.py          what trident raises, and the codes device waits record
  control.py         the layout of each rank's control block (error word, timeout, flags)
  placement.py       which GPU a rank uses, how many ranks share it, their SMs
  mps.py             the job's private MPS daemon when ranks share a GPU
  heap/              the symmetric heap: allocator.py (the sub-allocator), cuda.py (torch
                     symmetric memory), cpu.py (one /dev/shm file per rank)
  graph_pools.py     buffers kept past a call, made outside CUDA-graph pools
  triton_launch.py   the one module that uses Triton internals (the fast launcher)
  plans.py           launch plans: a call's host work done once per signature, and the
                     one driver every op family calls (plans.call / plan_for)
  emulation.py       what the CPU emulation changes in Triton's interpreter
  context_exchange.py, context_sync.py, context_heap.py, context.py
                     the Context, one seam per file: host exchanges; sync, barrier and
                     errors; tensor factories and workspaces; construction and lifetime
                     (trident.Context adds the families' methods: trident/api/)
  launch.py          spawn N ranks (GPUs, or CPU processes) for scripts, tests and tools

Nothing is imported here: `import trident` loads _env.py first.
"""
