"""The multi-node layer: a job whose ranks span several nodes (NVLink domains), with the
same API as one node (docs/nodes.md).

    topology.py        nodes and rails of a job (TRIDENT_NODE_SIZE, LOCAL_WORLD_SIZE, host
                       names) and their torch.distributed sub-groups
    world.py           WorldContext (trident.WorldContext): what trident.init returns across
                       nodes, a node-local Context inside (ctx.node)
    rail.py            the rail steps: torch.distributed calls between the ranks of one
                       local index (NCCL on GPUs, gloo on the CPU emulation)
    cost.py            the cost model that picks "hierarchical" or "nccl" per call
    hierarchical/      the five collectives across nodes, one file per op
    expert_parallel.py ExpertParallel across nodes (DeepEP's two-stage route), what
                       td.ExpertParallel(ctx, ...) makes on a WorldContext
    rail_route.py      its kernels: packing rows per node, unpacking, fp8 forwarding

The node-local library (ccl, ops, moe) does not import this package; this package uses
it. Nothing is imported here, so that `trident.nodes.topology` (which trident.init uses)
stays light.
"""
