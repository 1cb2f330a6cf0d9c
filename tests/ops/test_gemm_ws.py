"""Warp specialisation in trident/ops/gemm.py: a config that asks for it runs with
in-kernel TMA descriptors (triton 3.6 hangs with host-made ones: the note above
gemm.CANDIDATES), gives the right values, and refuses desc="host"; no candidate or table
entry asks for it. Runs in this process; under the interpreter on a CPU."""
import json

import pytest
import torch

from trident.ops import gemm

from .reference import assert_close, make

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
WS = dict(gemm.INTERPRET_CONFIG if gemm.INTERPRET else gemm.CANDIDATES["128x128x64_s4_w8"],
          num_warps=4, WARP_SPECIALIZE=True)


def test_warp_specialised_config_takes_kernel_descriptors():
    a, w = make((48, 64), 1, torch.bfloat16, DEVICE), make((80, 64), 2, torch.bfloat16, DEVICE)
    out = torch.empty(48, 80, dtype=torch.bfloat16, device=DEVICE)
    _, _, kwargs = gemm.launch_args(a, w, None, out, config=WS, split_k=1)
    assert kwargs["WARP_SPECIALIZE"] and not kwargs["HOST_DESC"]
    assert_close(gemm.matmul(a, w, config=WS, split_k=1), a.float() @ w.float().T, "ws")
    with pytest.raises(ValueError, match="in-kernel descriptors"):
        gemm.matmul(a, w, config=WS, desc="host")
    # with split-K the kernel is not warp-specialised: host descriptors are fine
    _, _, kwargs = gemm.launch_args(a, w, None, out, config=WS, desc="host", split_k=2)
    assert not kwargs["WARP_SPECIALIZE"] and kwargs["HOST_DESC"]
    assert_close(gemm.matmul(a, w, config=WS, desc="host", split_k=2), a.float() @ w.float().T,
                 "ws config, split 2")


def test_no_candidate_is_warp_specialised():
    with open(gemm.TABLE_PATH) as f:
        listed = json.load(f)["candidates"]
    for name, cfg in {**gemm.CANDIDATES, **listed}.items():
        assert not cfg["WARP_SPECIALIZE"], name
