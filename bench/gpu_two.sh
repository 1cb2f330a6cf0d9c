#!/usr/bin/env bash
# Device calls on a machine with TWO (or more) GPUs, one rank per GPU. Steps chosen with
# STEPS (default: env tests); logs under $OUT (at most 8 files come back from a call).
#   env     GPU, versions (torch, triton, NCCL), topology
#   tests   the suite at 2 ranks in SHARDS (';'-separated test paths), side by side: Triton
#           compiles are CPU work, and one pytest is compile-bound. No MPS: each shard's ranks
#           time-slice the GPUs with the other shards', which costs speed, not correctness.
#           The soak (SOAK_OPS mixed ops, NCCL the reference) and REPEAT runs of
#           REPEAT_TESTS (a flaky fault: race or bad data?) run beside them.
#   repeat  REPEAT_TESTS REPEAT times (a flaky fault: race or bad data)
#   hier    the hierarchical collectives as 2 nodes x 1 rank (NCCL on the rails), tests and
#           host time
#   nodes   contexts across nodes as 2 nodes x 1 rank (NCCL on the rails): tests of the
#           hierarchical collectives and MoE across nodes, bench moe across nodes
#           (MOE_MODELS, MOE_TOKENS) and the hierarchical launch/host bench
#   nodes1  the same tests as 2 nodes x 2 ranks sharing GPU 0 under MPS (gloo rails)
#   gemm    the GEMM core's table of this GPU model on GPU 0 (bounded bench gemm, Llama-3
#           layers at 2 ranks' shapes, M 1..8192): written as trident/ops/gemm_table_<gpu>.json
#           in this copy (later steps use it) and copied to $OUT; rows in $OUT/gemm.tar.gz
#   fused   issue 30's two-GPU targets: bench ops at 2 ranks (one per GPU), Llama-3-8B and
#           -70B TP=2 layers, every schedule and auto against NCCL + cuBLAS, torch async-TP
#           and sequential, M 1..8192, eager and graph, checked (all_gather_matmul's fused
#           kernel on each GEMM core of FUSED_CORES too: rows trident_fused[tma|gluon]);
#           prints the targets and
#           each miss; then pass 2: trident/ops/schedule_table.json rebuilt from that run
#           (bench/schedule_table.py) and auto + NCCL/cuBLAS measured again with it (suite
#           ops-auto; FUSED_PASS2=0 skips it; step fused2 is pass 2 alone, on FUSED_RUN or the
#           newest committed run); JSON, PNGs, table and logs in $OUT/fused.tar.gz (after
#           `gemm` to use its table). Pass 1 + 2 fit one device call (380 + 150 s at most)
#   ops     bench ops at 2 ranks, Llama-3-70B TP=2 layers at OPS_M
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -o 'H[0-9][0-9]*' | head -1 | tr A-Z a-z)
N=$(nvidia-smi -L 2>/dev/null | wc -l)
LOG=$OUT/gpu-tests-${N}x${GPU:-gpu}-$(date +%F)${TAG:-}.log
say() { echo "$@" | tee -a $LOG; }
T="timeout -s INT -k 30"
for step in ${STEPS:-env tests}; do
  start=$SECONDS
  case $step in
  env)
    { nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv
      python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
      git log --oneline -1 2>/dev/null || true
      nvidia-smi topo -m; } 2>&1 | tee -a $LOG ;;
  tests)
    IFS=';' read -ra shards <<< "${SHARDS:-tests/ccl tests/torch_ops;tests/ops tests/moe tests/fuzz;tests/sanitize tests/trace tests/faults tests/heap tests/language tests/plans tests/compile tests/test_*.py}"
    pids=(); i=0
    for s in "${shards[@]}"; do
      TRIDENT_TEST_WORLD_SIZES=2 $T ${TEST_TIMEOUT:-480} python3 -m pytest -q -rfEs --tb=short \
        -p no:cacheprovider --durations=10 -v --timeout ${PER_TEST:-150} $s > $OUT/tests-$i.log 2>&1 &
      pids+=($!); i=$((i + 1))
    done
    if [ -n "${REPEAT_TESTS:-}" ]; then      # a flaky fault's tests, again and again, beside
      ( for k in $(seq ${REPEAT:-5}); do
          TRIDENT_TEST_WORLD_SIZES=2 $T 150 python3 -m pytest -q -p no:cacheprovider --timeout 120 \
            $REPEAT_TESTS > /tmp/repeat-$k.log 2>&1
          echo "== repeat $k rc=$?: $(grep -E 'passed|failed' /tmp/repeat-$k.log | tail -1)"
          grep -E "^(FAILED|ERROR)|nan|NaN" /tmp/repeat-$k.log | head -5
        done > $OUT/repeat.log 2>&1 ) &
      repeat=$!
    fi
    if [ "${SOAK_OPS:-0}" != 0 ]; then
      $T ${SOAK_TIMEOUT:-480} python3 -m bench.lab.soak --world 2 --ops $SOAK_OPS \
        --log $OUT/soak.log > $OUT/soak-out.log 2>&1 &
      soak=$!
    fi
    i=0
    for s in "${shards[@]}"; do
      wait ${pids[$i]}; rc=$?
      say "== pytest shard $i rc=$rc: $s"
      grep -E "^(FAILED|ERROR)|passed|failed|no tests ran" $OUT/tests-$i.log | tee -a $LOG | tail -${TAIL:-25}
      i=$((i + 1))
    done
    if [ -n "${repeat:-}" ]; then wait $repeat; say "== repeats: $REPEAT_TESTS"; tee -a $LOG < $OUT/repeat.log; fi
    if [ -n "${soak:-}" ]; then wait $soak; say "== soak rc=$?"; tail -6 $OUT/soak-out.log | tee -a $LOG; fi ;;
  repeat)
    for k in $(seq ${REPEAT:-10}); do
      TRIDENT_TEST_WORLD_SIZES=2 $T 120 python3 -m pytest -q -p no:cacheprovider --timeout 100 \
        $REPEAT_TESTS > $OUT/repeat.log 2>&1
      say "== repeat $k rc=$?: $(grep -E 'passed|failed' $OUT/repeat.log | tail -1)"
      grep -E "^(FAILED|ERROR)|nan|NaN" $OUT/repeat.log | head -5 | tee -a $LOG
    done ;;
  hier)
    TRIDENT_TEST_WORLD_SIZES=2 $T 200 python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider \
      --timeout 150 tests/ccl/test_hierarchical.py > $OUT/hier-tests.log 2>&1
    say "== hierarchical tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/hier-tests.log | tee -a $LOG
    if [ -f bench/lab/hierarchical.py ]; then
      TRIDENT_NODE_SIZE=1 $T 150 python3 -m bench.lab.hierarchical --world-size 2 \
        --out-dir $OUT > $OUT/hier-bench.log 2>&1
      say "== hierarchical bench rc=$?"; tail -30 $OUT/hier-bench.log | tee -a $LOG
    fi ;;
  nodes)
    TRIDENT_TEST_WORLD_SIZES=2 $T 240 python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider \
      --timeout 200 tests/ccl/test_hierarchical.py tests/moe/test_across_nodes.py > $OUT/nodes-tests.log 2>&1
    say "== tests across nodes (2x1, NCCL) rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/nodes-tests.log | tee -a $LOG
    TRIDENT_NODE_SIZE=1 $T 240 python3 -m trident.bench.moe --world-size 2 \
      --models ${MOE_MODELS:-deepseek-v3} --tokens ${MOE_TOKENS:-128,4096} --out-dir $OUT > $OUT/nodes-moe.log 2>&1
    say "== bench moe across nodes rc=$?"; grep -v "^moe \[" $OUT/nodes-moe.log | tr '\r' '\n' | grep -v "^moe \[" | tail -30 | tee -a $LOG
    if [ -f bench/lab/hierarchical.py ]; then
      $T 200 python3 -m bench.lab.hierarchical ${HIER_ARGS:---world 2 --node-size 1} \
        > $OUT/nodes-hier.log 2>&1
      say "== hierarchical bench rc=$?"; tail -40 $OUT/nodes-hier.log | tee -a $LOG
    fi ;;
  nodes1)
    MPS=$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)
    $MPS -d && say "MPS daemon started"; sleep 2
    CUDA_VISIBLE_DEVICES=0 TRIDENT_TEST_NODE_WORLD=4 $T 300 python3 -m pytest -q -rfEs --tb=short \
      -p no:cacheprovider --timeout 250 tests/ccl/test_hierarchical.py tests/moe/test_across_nodes.py \
      > $OUT/nodes1-tests.log 2>&1
    say "== tests across nodes (2x2 on one GPU, gloo) rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/nodes1-tests.log | tee -a $LOG
    echo quit | $MPS ;;
  gemm)
    # bench/gpu_one.sh's gemm step on GPU 0 (its log beside this one)
    CUDA_VISIBLE_DEVICES=0 STEPS=gemm OUT=$OUT bash bench/gpu_one.sh
    say "== gemm step: $(tail -1 $OUT/gpu-tests-1x${GPU:-gpu}-$(date +%F)${TAG:-}.log)" ;;
  fused|fused2)
    mkdir -p /tmp/fused
    LAYERS=${FUSED_LAYERS:-llama3-8b,llama3-70b}; MS=${FUSED_M:-1,16,64,256,1024,4096,8192}
    TIMES="--calls ${FUSED_CALLS:-20} --reps ${FUSED_REPS:-3}"
    if [ $step = fused ]; then
      $T ${FUSED_TIMEOUT:-380} python3 -m trident.bench.ops --world-size 2 --layers $LAYERS \
        --m $MS $TIMES --budget-s ${FUSED_BUDGET:-300} --cores ${FUSED_CORES:-tma,gluon} \
        --out-dir /tmp/fused > /tmp/fused/fused.log 2>&1
      say "== bench ops, fused schedules at 2 GPUs rc=$?"
      tr '\r' '\n' < /tmp/fused/fused.log | grep -v "^ops \[\|FutureWarning\|enable_symm_mem" \
        | grep -E "^targets|^  miss|not run|skipped|results:|Error|error" | head -60 | tee -a $LOG
    fi
    # pass 2 (FUSED_PASS2=0: none): auto's table rebuilt from the full run (this step's, or
    # FUSED_RUN, or the newest committed one of this GPU), then auto (and NCCL + cuBLAS, the
    # reference) measured again with it, eager and graph: suite ops-auto
    if [ "${FUSED_PASS2:-1}" = 1 ]; then
      RUN=${FUSED_RUN:-$(ls -t /tmp/fused/ops-[0-9]*x*.json 2>/dev/null | head -1)}
      RUN=${RUN:-$(ls bench/results/ops-2x${GPU:-h}*.json 2>/dev/null | sort | tail -1)}
      python3 bench/schedule_table.py $RUN > /tmp/fused/schedule_table.log 2>&1
      say "== auto's table from $RUN rc=$?: $(head -1 /tmp/fused/schedule_table.log)"
      cp trident/ops/schedule_table.json /tmp/fused/
      $T ${FUSED2_TIMEOUT:-150} python3 -m trident.bench.ops --world-size 2 --auto-only \
        --layers $LAYERS --m $MS $TIMES --budget-s ${FUSED2_BUDGET:-100} --out-dir /tmp/fused \
        > /tmp/fused/fused-auto.log 2>&1
      say "== bench ops --auto-only with that table rc=$?"
      tr '\r' '\n' < /tmp/fused/fused-auto.log | grep -E "results:|Error|error|not run" | head -20 | tee -a $LOG
    fi
    tar czf $OUT/fused.tar.gz -C /tmp/fused . ;;
  ops)
    # the fused ops against NCCL + cuBLAS (OPS_M), after `gemm` so that they use its table
    $T ${OPS_TIMEOUT:-150} python3 -m trident.bench.ops --world-size 2 --layers llama3-70b \
      --m ${OPS_M:-64,256,1024,4096,8192} --out-dir $OUT > $OUT/ops.log 2>&1
    say "== bench ops rc=$?"; grep -v "FutureWarning\|enable_symm_mem" $OUT/ops.log | tr '\r' '\n' \
      | grep -v "^ops \[" | tail -40 | tee -a $LOG ;;
  *) python3 $step 2>&1 | tee -a $LOG ;;
  esac
  say "== step $step: $((SECONDS - start)) s"
done
