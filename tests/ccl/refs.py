"""Inputs and independent references shared by the collective tests: every rank builds
every rank's random input from the same seeds, so each can compute the expected result
with plain torch."""
import torch

BLOCK = 64          # small blocks on the emulation, so that programs loop over several


def rank_inputs(world_size, shape, dtype, seed):
    """The input of every rank (random, never zeros), identical on all ranks."""
    out = []
    for r in range(world_size):
        g = torch.Generator().manual_seed(seed * 1000 + r)
        if dtype.is_floating_point:
            x = torch.randn(shape, generator=g).to(dtype)
        elif dtype == torch.bool:
            x = torch.randint(0, 2, shape, generator=g).bool()
        else:       # the whole range: int32 sums past fp32's 24 bits, int64's past 53, wrapping
            info = torch.iinfo(dtype)
            x = torch.randint(info.min, info.max, shape, generator=g, dtype=dtype)
        out.append(x)
    return out


def reduce_ref(xs, op):
    """op over the list in rank order, accumulated in fp32 (floats; cast back) or in the
    integer type itself (wrapping around, as torch.distributed's sums do)."""
    acc = xs[0].float() if xs[0].is_floating_point() else xs[0]
    for x in xs[1:]:
        x = x.to(acc.dtype)
        acc = acc + x if op == "sum" else torch.maximum(acc, x) if op == "max" else torch.minimum(acc, x)
    return acc.to(xs[0].dtype)


def place(ctx, x, symmetric):
    """x on this rank's device, on the heap or as a plain tensor."""
    if symmetric:
        t = ctx.empty(*x.shape, dtype=x.dtype)
        return t.copy_(x)
    return x.clone().to(ctx.device)


def assert_equal(got, expected, what):
    got, expected = got.cpu(), expected.cpu()
    if got.dtype.is_floating_point:
        # bf16: the Triton interpreter rounds fp32 -> bf16 by truncation, not to nearest
        # as torch and the GPU do, so allow one bf16 step there.
        tol = 1.6e-2 if got.dtype == torch.bfloat16 else 1e-6
        torch.testing.assert_close(got, expected, rtol=tol, atol=1e-5, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, expected), f"{what}: {got} != {expected}"


def captured(ctx, fn):
    """A CUDA graph of fn(), after one eager call of it (the warm-up: workspaces and plans
    are made outside the capture), between barriers so that no rank replays early."""
    fn()
    ctx.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    ctx.barrier()
    return graph
