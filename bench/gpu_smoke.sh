#!/usr/bin/env bash
# One device call: environment facts, the foundation tests, the demo, a short p2p run.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,memory.total --format=csv | tee $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count())" | tee -a $OUT/env.txt
nvidia-smi topo -m | tee -a $OUT/env.txt
timeout 300 python3 -m pytest -x -q -ra ${TESTS:-tests/heap tests/language} 2>&1 | tee $OUT/tests.log | tail -25
timeout 120 python3 -m trident.cli demo 2>&1 | tee $OUT/demo.log
timeout 200 python3 -m trident.cli bench p2p --out-dir $OUT ${P2P_ARGS:-} 2>&1 | tee $OUT/p2p.log | tail -20
