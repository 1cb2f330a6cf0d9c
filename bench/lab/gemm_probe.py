"""One launch each of cuBLAS and trident's GEMM core configs at given shapes, between
cudaProfilerStart/Stop, for ncu to see (kernel name, grid, time, throughput):

    ncu --clock-control none --profile-from-start off --csv --section SpeedOfLight \
        --section LaunchStats python3 bench/lab/gemm_probe.py --shapes 256x4096x4096

Every launch is checked against torch.matmul first and warmed up outside the profiled
range; the labels go to stdout in launch order (ncu lists the kernels in that order; a
split-K or stream-K launch is one kernel). --configs: candidate names of
trident/ops/gemm_configs.py ("table": the package's table pick), each optionally
"@<split_k>" to force that many K slices (split-K's several-units-a-program case).
"""
from __future__ import annotations

import argparse

import torch

from trident.ops import gemm


def launches(shape: str, configs: list[str]):
    M, N, K = (int(x) for x in shape.split("x"))
    g = torch.Generator(device="cuda").manual_seed(M * 31 + N)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g) / K ** 0.5
    ref = a @ w.T
    yield f"{shape} cublas", lambda: a @ w.T
    for name in configs:
        base, _, split = name.partition("@")
        cfg = None if base == "table" else gemm.resolve(base)
        kw = dict(config=cfg, split_k=int(split) if split else None)
        out = gemm.matmul(a, w, **kw)
        err = (out.float() - ref.float()).abs().max().item()
        if err > 0.05:
            print(f"{shape} {name}: WRONG max err {err}", flush=True)
            continue
        yield f"{shape} {name}", lambda kw=kw: gemm.matmul(a, w, **kw)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="256x4096x4096")
    p.add_argument("--configs", default="table")
    a = p.parse_args()
    todo = [item for shape in a.shapes.split(",")
            for item in launches(shape, a.configs.split(","))]
    for _, fn in todo:                       # compile and warm up outside the profile
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for label, fn in todo:
        fn()
        torch.cuda.synchronize()
        print("launch", label, flush=True)
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
