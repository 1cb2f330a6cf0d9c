"""torch's own parallelism, unchanged, on a "trident" default group: tensor parallel
(parallelize_module with ColwiseParallel/RowwiseParallel over a DeviceMesh), FSDP2
(fully_shard) training steps and DTensor redistribution between Shard and Replicate. Each
is compared with the same code over a gloo group of the same ranks, in the same
processes (on CPU tensors: gloo's CUDA path lacks some of these collectives), and with a
single-process reference. The trident DeviceMesh's device type is trident's device ("cpu"
on the emulation, whose tensors are CPU tensors; "cuda" on GPUs)."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

D, H = 16, 24            # model width and hidden width (H divisible by 2, 3 and 4 ranks)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(D, H), nn.Linear(H, D)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _meshes(ctx):
    """[(the mesh over the trident default group, as torch programs make it, its device),
    (a mesh over a gloo group of the same ranks, the CPU)]: made once per rank process."""
    cached = getattr(ctx, "_test_meshes", None)
    if cached is None:
        gloo = dist.new_group(backend="gloo")
        cpu = torch.device("cpu")
        cached = ctx._test_meshes = [
            (init_device_mesh(ctx.device.type, (ctx.world_size,)), ctx.device),
            (DeviceMesh.from_group(gloo, "cpu"), cpu)]
    return cached


def _close(ctx, got, want):
    """Equal up to float rounding: exactly the same arithmetic on the CPU emulation (gloo
    and trident both sum two ranks' values alike), cuBLAS against the CPU on GPUs."""
    tol = {} if ctx.device.type == "cpu" else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, want, **tol)


def _sgd_steps(model, device, steps=3):
    """Losses of a few SGD steps of `model` on the same inputs on every rank (as tensor
    parallelism has), and its first output."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(5)
    losses, first = [], None
    for _ in range(steps):
        y = model(torch.randn(7, D, generator=g).to(device))
        first = y.detach().cpu() if first is None else first
        loss = y.pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, first


def _tp_steps(mesh, device):
    """The MLP under tensor parallelism over `mesh`."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    torch.manual_seed(0)
    model = MLP().to(device)
    parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return _sgd_steps(model, device)


def _reference_tp_steps():
    """The same steps in one process, unsharded."""
    torch.manual_seed(0)
    return _sgd_steps(MLP(), torch.device("cpu"))


def _tensor_parallel(ctx):
    (trident_mesh, device), (gloo_mesh, cpu) = _meshes(ctx)
    before = dist.group.WORLD.fallbacks.copy()
    got, first = _tp_steps(trident_mesh, device)
    fell = dist.group.WORLD.fallbacks - before
    assert set(fell) <= {"scatter"}, fell    # parallelize_module scatters the parameters
    want, want_first = _tp_steps(gloo_mesh, cpu)
    ref, ref_first = _reference_tp_steps()
    _close(ctx, first, want_first)
    _close(ctx, got, want)
    torch.testing.assert_close(first, ref_first, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    return got


def test_tensor_parallel_mlp(tpool):
    losses = tpool.run(_tensor_parallel)
    assert all(l == losses[0] for l in losses), losses     # the same on every rank


def _fsdp_steps(mesh, device, steps=3):
    """Losses of a few Adam steps of two MLPs under FSDP2 (each and the root sharded),
    every rank with its own batch."""
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = nn.Sequential(MLP(), MLP()).to(device)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    losses = []
    for _ in range(steps):
        loss = model(torch.randn(4, D, generator=g).to(device)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _reference_fsdp_steps(world, rank, steps=3):
    """The same steps in one process: the unsharded model on every rank's batch, the
    gradient the mean of the ranks' (what FSDP2's averaging reduce-scatter gives); rank
    `rank`'s losses."""
    torch.manual_seed(0)
    model = nn.Sequential(MLP(), MLP())
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    gens = [torch.Generator().manual_seed(100 + r) for r in range(world)]
    losses = []
    for _ in range(steps):
        per_rank = [model(torch.randn(4, D, generator=g)).pow(2).mean() for g in gens]
        (sum(per_rank) / world).backward()
        opt.step()
        opt.zero_grad()
        losses.append(per_rank[rank].item())
    return losses


def _fsdp(ctx):
    (trident_mesh, device), (gloo_mesh, cpu) = _meshes(ctx)
    before = dist.group.WORLD.fallbacks.copy()
    got = _fsdp_steps(trident_mesh, device)
    fell = dist.group.WORLD.fallbacks - before
    # fully_shard's first placement of the parameters scatters them (a fallback op)
    assert set(fell) <= {"scatter"}, fell
    _close(ctx, got, _fsdp_steps(gloo_mesh, cpu))
    torch.testing.assert_close(got, _reference_fsdp_steps(ctx.world_size, ctx.rank),
                               rtol=1e-5, atol=1e-6)
    return got


def test_fsdp2_training_steps(tpool):
    losses = tpool.run(_fsdp)
    assert len({tuple(l) for l in losses}) == len(losses), "every rank has its own batch"


def _redistribute(ctx):
    """A DTensor Shard(0) -> Replicate -> Shard(1) -> Shard(0), the full tensor checked at
    every step (Shard -> Replicate all-gathers, Shard(1) -> Shard(0) is an all-to-all,
    Replicate -> Shard takes a slice), and Partial -> Replicate / Shard (all-reduce,
    reduce-scatter); odd sizes (uneven shards)."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    w = ctx.world_size
    for mesh, device in _meshes(ctx):
        before = dist.group.WORLD.fallbacks.copy()
        full = torch.arange(7 * 10, dtype=torch.float32).reshape(7, 10).to(device)
        d = distribute_tensor(full, mesh, [Shard(0)])
        for placement in (Replicate(), Shard(1), Shard(0)):
            d = d.redistribute(mesh, [placement])
            torch.testing.assert_close(d.full_tensor(), full)
        local = torch.full((6, 4), float(ctx.rank + 1), device=device)
        p = DTensor.from_local(local, mesh, [Partial()])
        total = torch.full((6, 4), float(w * (w + 1) // 2))
        torch.testing.assert_close(p.redistribute(mesh, [Replicate()]).to_local().cpu(), total)
        s = p.redistribute(mesh, [Shard(0)])
        torch.testing.assert_close(s.full_tensor().cpu(), total)
        fell = dist.group.WORLD.fallbacks - before
        assert set(fell) <= {"scatter"}, fell    # distribute_tensor scatters the shards
    return True


def test_dtensor_redistribute(tpool):
    assert all(tpool.run(_redistribute))


def _tp_builds_per_step(ctx):
    """RowwiseParallel's all_reduce goes through functional collectives, which hand the
    backend a fresh tensor each step: after the first steps, no step builds a plan
    (trident's plan of plain tensors, ccl._plain_key), and the losses stay right."""
    (trident_mesh, device), _ = _meshes(ctx)
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    torch.manual_seed(0)
    model = MLP().to(device)
    parallelize_module(model, trident_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    _sgd_steps(model, device, steps=2)
    builds = ctx.plans.builds
    got, _ = _sgd_steps(model, device, steps=4)
    built = ctx.plans.builds - builds
    torch.manual_seed(0)
    ref, cpu = MLP(), torch.device("cpu")     # the same steps in one process, unsharded
    _sgd_steps(ref, cpu, steps=2)
    return built, got, _sgd_steps(ref, cpu, steps=4)[0]


def test_tp_steps_build_no_plan(tpool):
    for built, got, want in tpool.run(_tp_builds_per_step):
        assert built == 0, f"{built} plan builds in 4 TP steps"
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
