#!/usr/bin/env bash
# Device calls on a machine with ONE GPU: ranks share it (round-robin placement, gloo host
# group, a private MPS daemon per job; trident/placement.py, trident/mps.py). Steps chosen
# with STEPS (default: env tests demo examples); logs under $OUT.
#   env       GPU, versions, MPS binary
#   tests     pytest at TEST_WORLDS (default 1,2,4) over TESTS (default: tests)
#   demo      trident demo at 1, 2 and 4 ranks
#   examples  examples/*.py at 2 ranks
#   soak      python -m trident.bench.soak at 2 ranks (SOAK_OPS, default 100000)
#   bench     trident bench ccl/ops/moe at 2 ranks (host figures; device figures are HBM)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/nvidia/bin
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -o 'H[0-9][0-9]*' | head -1 | tr A-Z a-z)
DAY=$(date +%F)
LOG=$OUT/gpu-tests-1x${GPU:-gpu}-$DAY${TAG:-}.log
say() { echo "$@" | tee -a $LOG; }
for step in ${STEPS:-env tests demo examples}; do
  start=$SECONDS
  case $step in
  env)
    { nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv
      python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
      echo "mps control: $(command -v nvidia-cuda-mps-control || echo none)"; } 2>&1 | tee -a $LOG ;;
  tests)
    # The world sizes run side by side (Triton's compiles are CPU work: 16 cores), under
    # one MPS daemon, each rank capped so that all ranks of all worlds add up to 100 % of
    # the GPU (TEST_SHARES: percent per rank of each world), so every rank's programs stay
    # resident. A log per world; the summary lines go to $LOG.
    nvidia-cuda-mps-control -d && say "MPS daemon started for the test pass"
    shares=(${TEST_SHARES:-16 18 12}); i=0; pids=()
    for w in $(echo ${TEST_WORLDS:-1,2,4} | tr , ' '); do
      TRIDENT_TEST_WORLD_SIZES=$w CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${shares[$i]} \
        timeout ${TEST_TIMEOUT:-500} python3 -m pytest -q -ra -p no:cacheprovider --durations=15 \
        --timeout ${PER_TEST:-150} ${TESTS:-tests} > $OUT/tests-world$w.log 2>&1 &
      pids+=($!); i=$((i + 1))
    done
    i=0
    for w in $(echo ${TEST_WORLDS:-1,2,4} | tr , ' '); do
      wait ${pids[$i]}; rc=$?; i=$((i + 1))
      say "== pytest world $w (${shares[$((i - 1))]} % of the GPU per rank) rc=$rc: ${TESTS:-tests}"
      grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed|[0-9.]+s (call|setup)" $OUT/tests-world$w.log | tee -a $LOG | tail -${TAIL:-30}
    done
    echo quit | nvidia-cuda-mps-control ;;
  demo)
    for w in 1 2 4; do
      timeout 240 python3 -m trident.cli demo --world-size $w >> $LOG 2>&1; say "demo world $w rc=$?"
    done ;;
  examples)
    for ex in "quickstart.py" "tp_decode.py --world 2 --sum all_reduce" \
              "tp_decode.py --world 2 --sum fused" "tp_decode.py --world 2 --sum matmul_all_reduce" \
              "moe_layer.py --world-size 2"; do
      timeout 240 python3 examples/$ex >> $LOG 2>&1; say "example $ex rc=$?"
    done ;;
  soak)
    timeout ${SOAK_TIMEOUT:-400} python3 -m trident.bench.soak --world 2 --ops ${SOAK_OPS:-100000} \
      --log $OUT/soak-1x${GPU:-gpu}-2x-$DAY.log 2>&1 | tail -30 | tee -a $LOG; say "soak rc=${PIPESTATUS[0]}" ;;
  bench)
    for s in ${SUITES:-ccl ops moe}; do
      timeout ${BENCH_TIMEOUT:-150} python3 -m trident.cli bench $s --world-size 2 --out-dir $OUT ${BENCH_ARGS:-} \
        > $OUT/bench-$s.log 2>&1; say "bench $s rc=$?"; tail -15 $OUT/bench-$s.log
    done ;;
  *) python3 $step 2>&1 | tee -a $LOG ;;
  esac
  say "== step $step: $((SECONDS - start)) s"
done
