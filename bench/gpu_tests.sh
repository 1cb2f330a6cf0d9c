#!/usr/bin/env bash
# One device call: environment facts, the whole test suite, the demo, traces.
# Usage on the device: OUT=... bash bench/gpu_tests.sh   (TESTS=... to narrow)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
{ nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
  nvidia-smi topo -m; } > $OUT/env.txt 2>&1
timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q -ra -p no:cacheprovider ${TESTS:-tests} > $OUT/tests.log 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.log | tail -15
timeout 60 python3 -m trident.cli demo > $OUT/demo.log 2>&1; echo "demo rc=$?"; tail -4 $OUT/demo.log
