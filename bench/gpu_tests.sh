#!/usr/bin/env bash
# One device call: environment facts, the whole test suite (2 ranks and all GPUs), the
# demo, and two traces. Usage there: OUT=... bash bench/gpu_tests.sh (TESTS=... to narrow)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
{ nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
  nvidia-smi topo -m; } > $OUT/env.txt 2>&1
timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -ra -p no:cacheprovider --timeout ${PER_TEST:-90} \
  ${TESTS:-tests} > $OUT/tests.log 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Timeout" $OUT/tests.log | tail -25
timeout 60 python3 -m trident demo > $OUT/demo.log 2>&1; echo "demo rc=$?"; tail -3 $OUT/demo.log
if [ -z "${NO_TRACE:-}" ]; then
  timeout 90 python3 -m trident trace all_gather -o $OUT/trace-all_gather.json > $OUT/trace.log 2>&1
  echo "trace all_gather rc=$?"
  timeout 90 python3 -m trident trace moe --tokens 128 --hidden 2048 -o $OUT/trace-moe.json >> $OUT/trace.log 2>&1
  echo "trace moe rc=$?"
  timeout 90 python3 -m bench.lab.trace_overhead >> $OUT/trace.log 2>&1; echo "overhead rc=$?"
  tail -25 $OUT/trace.log
fi
