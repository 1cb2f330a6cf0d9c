#!/usr/bin/env bash
# Device calls on a machine with ONE GPU: ranks share it (round-robin placement, gloo host
# group, MPS; trident/runtime/placement.py, trident/runtime/mps.py). Steps chosen with STEPS (default: env
# tests checks); logs under $OUT (at most 8 files come back from a device call).
#   env       GPU, versions, MPS binary
#   tests     pytest at TEST_WORLDS (default 1,2,4), side by side, over TESTS (default: tests);
#             PLAN_GRAPHS=all and CAPTURE=light as in allgraphs
#   checks    gemm tests, demo at 1/2/4 ranks, examples at 2 ranks, soak, bench host figures
#   gemm      the GEMM core's table of this GPU model (bounded bench gemm, Llama-3 layers at
#             2 ranks' shapes, M 1..8192): trident/ops/gemm_table_<gpu>.json in this copy
#             (ops1 uses it) and in $OUT; rows and log in $OUT/gemm.tar.gz
#   ops1      bench ops with 2 ranks sharing the GPU (MPS): every schedule of the fused ops,
#             checked and timed against each other; device times labelled "HBM (ranks
#             share one GPU)"; JSON and log in $OUT/ops1.tar.gz
#   backend   issue 31 on 2 ranks sharing the GPU (MPS): pytest tests/torch_dist (backend
#             "trident": collectives, torch's TP / FSDP2 / DTensor against gloo, streams, CUDA
#             graphs) and tests/compat (DeepEP's API); then the backend's host-cost bench
#             (JSON) and bench/deep_ep_host_cost.py (JSON lines). Logs and JSON in $OUT
#   combine   issue 40: the high-throughput MoE path at DeepSeek-V3, 4096 tokens, 2 ranks
#             sharing the GPU (MPS): dispatch, combine and combine_wd, eager and graph GB/s,
#             the one-pass combine (row trident) against the staged one it replaced (row
#             "trident (staged combine)"); HBM, not NVLink. Log and JSON in $OUT
#   graphs    issue 39 item 5: bench/lab/plan_graphs.py, each plan launched directly against
#             replayed as a CUDA graph (plan graphs multi / all), host and eager us per call
#             at 2 ranks sharing the GPU (MPS: host figures; device times are HBM's) and at
#             1 rank. JSON and logs in $OUT
#   allgraphs issue 39 item 5 (docs/latency.md "Plan graphs"): tests/ccl then tests/moe at
#             world 2 (2 ranks sharing the GPU, 25 % each since tests/moe/test_across_nodes
#             starts 4) under TRIDENT_PLAN_GRAPHS=all, plans captured by torch.cuda.graph
#             (CAPTURE=torch, the default) or by capture_begin/end on a side stream
#             (CAPTURE=light: bench/lab/capture_site on PYTHONPATH). Log in $OUT
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/nvidia/bin
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -o 'H[0-9][0-9]*' | head -1 | tr A-Z a-z)
DAY=$(date +%F)
LOG=$OUT/gpu-tests-1x${GPU:-gpu}-$DAY${TAG:-}.log
say() { echo "$@" | tee -a $LOG; }
for step in ${STEPS:-env tests checks}; do
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
    # PLAN_GRAPHS=all (TRIDENT_PLAN_GRAPHS) and CAPTURE=light as in allgraphs below
    nvidia-cuda-mps-control -d && say "MPS daemon started for the test pass (plan graphs ${PLAN_GRAPHS:-default}, capture ${CAPTURE:-torch})"
    [ -n "${PLAN_GRAPHS:-}" ] && export TRIDENT_PLAN_GRAPHS=$PLAN_GRAPHS
    [ "${CAPTURE:-torch}" = light ] && export PYTHONPATH=$PWD:$PWD/bench/lab/capture_site
    shares=(${TEST_SHARES:-16 18 12}); i=0; pids=()
    for w in $(echo ${TEST_WORLDS:-1,2,4} | tr , ' '); do
      # SIGINT at the limit: pytest then prints its summary of what failed so far
      TRIDENT_TEST_WORLD_SIZES=$w CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${shares[$i]} \
        timeout -s INT -k 30 ${TEST_TIMEOUT:-500} python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider --durations=15 \
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
  checks)
    # four chains side by side under one MPS daemon, each capped at about 20 % of the GPU:
    # gemm tests + demo at 1/2/4 ranks; the examples at 2 ranks; the soak at 2 ranks
    # (SOAK_OPS); host figures of bench ccl and moe at 2 ranks (JSON in bench-json.tar.gz)
    T="timeout -s INT -k 15"; mkdir -p /tmp/b
    nvidia-cuda-mps-control -d
    ( CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20 $T 100 python3 -m pytest -q -rfE --tb=short \
        -p no:cacheprovider tests/ops/test_gemm.py > $OUT/gemm-test.log 2>&1
      for w in 1 2 4; do
        CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=5 $T 70 python3 -m trident demo --world-size $w >> $OUT/demo.log 2>&1
        echo "== demo world $w rc=$?" >> $OUT/demo.log
      done ) &
    ( for ex in "quickstart.py" "tp_decode.py --world 2 --sum all_reduce" "tp_decode.py --world 2 --sum fused" \
                "tp_decode.py --world 2 --sum matmul_all_reduce" "moe_layer.py --world-size 2 --tokens 128"; do
        CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10 $T 60 python3 examples/$ex >> $OUT/examples.log 2>&1
        echo "== example $ex rc=$?" >> $OUT/examples.log
      done ) &
    ( CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10 $T ${SOAK_TIMEOUT:-290} python3 -m bench.lab.soak --world 2 \
        --ops ${SOAK_OPS:-4000} --log $OUT/soak.log > $OUT/soak-out.log 2>&1
      echo "== soak rc=$?" >> $OUT/soak-out.log ) &
    ( CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10 $T 160 python3 -m trident.bench.ccl --world-size 2 \
        --max-size 1M --factor 32 --calls 20 --reps 3 --out-dir /tmp/b > $OUT/bench-ccl.log 2>&1
      echo "== bench ccl rc=$?" >> $OUT/bench-ccl.log
      CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10 $T 120 python3 -m trident.bench.moe --world-size 2 \
        --models deepseek-v3 --tokens 1,128 --calls 20 --reps 3 --out-dir /tmp/b > $OUT/bench-moe.log 2>&1
      echo "== bench moe rc=$?" >> $OUT/bench-moe.log
      tar czf $OUT/bench-json.tar.gz -C /tmp/b $(cd /tmp/b && ls *.json 2>/dev/null) ) &
    wait
    echo quit | nvidia-cuda-mps-control
    grep -E "passed|failed" $OUT/gemm-test.log | tail -2 | tee -a $LOG
    grep -h "== " $OUT/demo.log $OUT/examples.log $OUT/soak-out.log $OUT/bench-*.log | tee -a $LOG
    tail -4 $OUT/soak-out.log | tee -a $LOG ;;
  gemm)
    mkdir -p /tmp/gemm
    timeout -s INT -k 30 ${GEMM_TIMEOUT:-240} python3 -m trident.bench.gemm \
      --layers ${GEMM_LAYERS:-llama3} --squares "${GEMM_SQUARES:-}" ${GEMM_M:+--m $GEMM_M} \
      --budget-s ${GEMM_BUDGET:-200} --out-dir /tmp/gemm --update-table trident/ops \
      > /tmp/gemm/gemm.log 2>&1
    say "== bench gemm rc=$?"; tr '\r' '\n' < /tmp/gemm/gemm.log | grep -v "^gemm \[" \
      | sed -n '/per shape class/,$p' | tee -a $LOG
    cp trident/ops/gemm_table_${GPU}.json $OUT/ 2>/dev/null || say "no table written"
    tar czf $OUT/gemm.tar.gz -C /tmp/gemm . ;;
  ops1)
    mkdir -p /tmp/ops1
    nvidia-cuda-mps-control -d && say "MPS daemon started for ops1"
    timeout -s INT -k 30 ${OPS1_TIMEOUT:-220} python3 -m trident.bench.ops --world-size 2 \
      --layers ${OPS1_LAYERS:-llama3-8b,llama3-70b} --m ${OPS1_M:-1,16,64,256,1024,4096,8192} \
      --calls ${OPS1_CALLS:-20} --reps ${OPS1_REPS:-3} --budget-s ${OPS1_BUDGET:-170} \
      --out-dir /tmp/ops1 > /tmp/ops1/ops1.log 2>&1
    say "== bench ops, 2 ranks sharing the GPU rc=$?"
    echo quit | nvidia-cuda-mps-control
    tr '\r' '\n' < /tmp/ops1/ops1.log | grep -v "^ops \[\|FutureWarning" \
      | grep -E "HBM|not run|skipped|wrong|error|Error|results:" | head -40 | tee -a $LOG
    tar czf $OUT/ops1.tar.gz -C /tmp/ops1 . ;;
  backend)
    # tests first (they compile the kernels the benches then find in Triton's cache); the
    # benches alone on the GPU afterwards, so their host figures are not disturbed
    T="timeout -s INT -k 20"
    nvidia-cuda-mps-control -d && say "MPS daemon started for the backend step"
    TRIDENT_TEST_WORLD_SIZES=2 $T ${BACKEND_TEST_TIMEOUT:-160} python3 -m pytest -q -rfEs \
      --tb=short -p no:cacheprovider --durations=10 --timeout 120 tests/torch_dist tests/compat \
      > $OUT/backend-tests.log 2>&1
    say "== pytest tests/torch_dist tests/compat, world 2 sharing the GPU rc=$?"
    grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" $OUT/backend-tests.log | tail -20 | tee -a $LOG
    $T 55 python3 -m trident.bench.torch_backend --world 2 --json $OUT/backend-bench.json \
      > $OUT/backend-bench.log 2>&1
    say "== bench torch_backend rc=$?"; tail -24 $OUT/backend-bench.log | tee -a $LOG
    $T 70 python3 bench/deep_ep_host_cost.py 2 > $OUT/deep-ep-host-cost.jsonl 2>&1
    say "== bench/deep_ep_host_cost.py rc=$?"; tail -4 $OUT/deep-ep-host-cost.jsonl | tee -a $LOG
    echo quit | nvidia-cuda-mps-control ;;
  combine)
    timeout -s INT -k 20 ${COMBINE_TIMEOUT:-220} python3 -m trident.bench.moe --world-size 2 \
      --models deepseek-v3 --tokens 4096 --combine-ab --phases dispatch,combine,combine_wd \
      --out-dir $OUT > $OUT/combine-ab.log 2>&1
    say "== bench moe --combine-ab (2 ranks share one GPU, MPS: HBM, not NVLink) rc=$?"
    tr '\r' '\n' < $OUT/combine-ab.log | grep -v "^moe \[" | tail -14 | tee -a $LOG ;;
  graphs)
    nvidia-cuda-mps-control -d && say "MPS daemon started for the graphs step"
    for w in 2 1; do
      CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / w)) timeout -s INT -k 20 \
        ${GRAPHS_TIMEOUT:-150} python3 -m bench.lab.plan_graphs --world $w \
        --json $OUT/plan-graphs-${w}on1x${GPU:-gpu}-$DAY.json > $OUT/plan-graphs-$w.log 2>&1
      say "== plan graphs A/B, world $w on one GPU rc=$?"; tail -13 $OUT/plan-graphs-$w.log | tee -a $LOG
    done
    echo quit | nvidia-cuda-mps-control ;;
  allgraphs)
    nvidia-cuda-mps-control -d && say "MPS daemon started for the allgraphs step"
    site=""; [ "${CAPTURE:-torch}" = light ] && site=":$PWD/bench/lab/capture_site"
    PYTHONPATH=$PWD$site TRIDENT_PLAN_GRAPHS=all TRIDENT_TEST_WORLD_SIZES=2 \
      CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 timeout -s INT -k 30 ${TEST_TIMEOUT:-500} \
      python3 -m pytest -q -rfE --tb=short -p no:cacheprovider --timeout ${PER_TEST:-150} \
      ${TESTS:-tests/ccl tests/moe} > $OUT/allgraphs-${CAPTURE:-torch}.log 2>&1
    say "== pytest world 2, plan graphs all, capture ${CAPTURE:-torch} rc=$?"
    grep -E "^(FAILED|ERROR)|passed|failed" $OUT/allgraphs-${CAPTURE:-torch}.log | tee -a $LOG
    echo quit | nvidia-cuda-mps-control ;;
  *) python3 $step 2>&1 | tee -a $LOG ;;
  esac
  say "== step $step: $((SECONDS - start)) s"
done
