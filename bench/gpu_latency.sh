#!/usr/bin/env bash
# Issue 39's latency pass on a machine of 2 or 4 GPUs, one rank per GPU. WORLDS (default:
# every GPU, then 2 on a 4-GPU machine) each run with the first w GPUs visible, so one
# 4-GPU machine gives the 2- and the 4-GPU figures. STEPS picks the steps (default: env
# tests times ccl); each call must stay under the device tool's 10 minutes: split them.
#   env     GPUs, versions, topology
#   tests   the tests of the Lamport paths, PDL and the newest ops at each world: all_reduce,
#           add_rmsnorm, reduce_scatter/all_gather/broadcast/all_to_all, fault cases, graph
#           replay, the epilogue exchanges, matmul_all_reduce_add_rmsnorm, integer
#           reductions (issue 41); then bench/lab/lamport_stress.py
#   times   bench/lab/kernel_times.py: graph time per call against the time inside kernels
#           (CUPTI), all_reduce 1/16 KiB (lamport with and without PDL, one_shot, torch
#           symm-mem, NCCL) and the MoE round at 1/128 tokens (hidden 7168 and 256)
#   phases  bench/lab/moe_phases.py: the MoE dispatch / combine phases (send, flag handoff,
#           receive) from the kernels' own trace events, 1 and 128 tokens
#   ccl     bench ccl: all_reduce 1 KiB .. 1 MiB (factor 4), the other four ops 1 .. 64 KiB,
#           lamport beside one_shot, two_shot, torch symm-mem and NCCL(-symmetric)
#   ops     bench ops at decode M (1 .. 256): the Lamport epilogue, the new
#           matmul_all_reduce_add_rmsnorm, beside sequential and NCCL + cuBLAS
#   moe     bench moe, DeepSeek-V3 at 1 and 128 tokens per rank
#   graphs  bench/lab/plan_graphs.py: eager host and device us per call with each plan
#           launched directly against replayed as a one-node CUDA graph (plan graphs
#           multi / all), all_reduce 1/16 KiB and the MoE round at 128 tokens
#   tp      bench tp (Llama-3-8B decode step): fused all_reduce_add_rmsnorm, its Lamport form
#   select  trident bench ccl --update-selector (the shipped table of this world), then
#           bench/make_results.py: run it once the rows say where lamport wins
# Output under $OUT: one log, the JSON of every bench, kernel times, a tarball of the rest.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT /tmp/lat
N=$(nvidia-smi -L 2>/dev/null | wc -l)
DAY=$(date +%F)
LOG=$OUT/latency-${N}xh200-$DAY${TAG:-}.log
T="timeout -s INT -k 20"
say() { echo "$@" | tee -a $LOG; }
WORLDS=${WORLDS:-$N$([ "$N" -ge 4 ] && echo " 2")}
TESTS="tests/ccl/test_all_reduce.py tests/ccl/test_all_reduce_rmsnorm.py
  tests/ccl/test_reduce_scatter.py tests/ccl/test_all_gather.py tests/ccl/test_broadcast.py
  tests/ccl/test_all_to_all.py tests/ccl/test_graph_replay.py
  tests/faults/test_no_silent_garbage.py tests/faults/test_mismatched_grids.py
  tests/ops/test_schedules.py tests/ops/test_schedule_errors.py
  tests/ops/test_matmul_all_reduce_add_rmsnorm.py tests/plans/test_plans.py
  tests/faults/test_no_silent_garbage_a2a.py"
visible() { seq -s, 0 $(($1 - 1)); }

run_world() {       # $1: world, $2: step
  local w=$1 tag="${1}xh200"
  export CUDA_VISIBLE_DEVICES=$(visible $w)
  case $2 in
  tests)
    TRIDENT_TEST_WORLD_SIZES=$w $T ${TEST_TIMEOUT:-240} python3 -m pytest -q -rfE --tb=short \
      -p no:cacheprovider --timeout 150 $TESTS ${EXTRA_TESTS:-} > /tmp/lat/tests-$w.log 2>&1
    say "== pytest world $w rc=$?"
    grep -E "^(FAILED|ERROR)|passed|failed" /tmp/lat/tests-$w.log | tail -12 | tee -a $LOG
    # every Lamport variant captured in a graph through torch.ops.trident
    TRIDENT_TEST_WORLD_SIZES=$w $T 200 python3 -m pytest -q -rfE --tb=short -p no:cacheprovider \
      --timeout 150 -k lamport tests/torch_ops/test_capture_all.py > /tmp/lat/capture-$w.log 2>&1
    say "== pytest capture (lamport) world $w rc=$?"
    grep -E "^(FAILED|ERROR)|passed|failed" /tmp/lat/capture-$w.log | tail -6 | tee -a $LOG
    $T 120 python3 -m bench.lab.lamport_stress --world $w --rounds 800 --flag-every 7 \
      > /tmp/lat/stress-$w.log 2>&1
    say "== lamport stress at $w ranks rc=$?"
    grep -E "^rank|FAILED" /tmp/lat/stress-$w.log | head -6 | tee -a $LOG ;;
  times)
    $T 200 python3 bench/lab/kernel_times.py --calls 20 > $OUT/kernel-times-$tag-$DAY.json \
      2>/tmp/lat/times-$w.log
    say "== kernel times world $w rc=$?"; tail -3 /tmp/lat/times-$w.log | tee -a $LOG ;;
  phases)
    $T 200 python3 bench/lab/moe_phases.py --calls 10 > $OUT/moe-phases-$tag-$DAY.json \
      2>/tmp/lat/phases-$w.log
    say "== moe phases world $w rc=$?"; tail -12 /tmp/lat/phases-$w.log | tee -a $LOG ;;
  ccl)
    $T 240 python3 -m trident.bench.ccl --ops all_reduce --max-size 1M --factor 4 --calls 50 \
      --reps 5 --out-dir /tmp/lat/ar-$w > /tmp/lat/ccl-ar-$w.log 2>&1
    say "== bench ccl all_reduce world $w rc=$?"; cp /tmp/lat/ar-$w/*.json $OUT/ 2>/dev/null
    $T 200 python3 -m trident.bench.ccl --ops all_gather,reduce_scatter,all_to_all,broadcast \
      --max-size 64K --factor 4 --calls 50 --reps 5 --out-dir /tmp/lat/rest-$w \
      > /tmp/lat/ccl-rest-$w.log 2>&1
    say "== bench ccl the other ops world $w rc=$?"; cp /tmp/lat/rest-$w/*.json $OUT/ 2>/dev/null ;;
  ops)
    $T 300 python3 -m trident.bench.ops --m 1,16,64,128,256 --calls 30 --reps 3 \
      --budget-s 260 --out-dir /tmp/lat/ops-$w > /tmp/lat/ops-$w.log 2>&1
    say "== bench ops at decode M world $w rc=$?"; cp /tmp/lat/ops-$w/*.json $OUT/ 2>/dev/null
    tr '\r' '\n' < /tmp/lat/ops-$w.log | grep -E "lamport|norm|results:" | head -30 | tee -a $LOG ;;
  moe)
    $T 200 python3 -m trident.bench.moe --models deepseek-v3 --tokens 1,128 \
      --out-dir /tmp/lat/moe-$w > /tmp/lat/moe-$w.log 2>&1
    say "== bench moe world $w rc=$?"; cp /tmp/lat/moe-$w/*.json $OUT/ 2>/dev/null ;;
  graphs)
    $T 240 python3 -m bench.lab.plan_graphs --world $w --json $OUT/plan-graphs-$tag-$DAY.json \
      > /tmp/lat/graphs-$w.log 2>&1
    say "== plan graphs A/B world $w rc=$?"; tail -13 /tmp/lat/graphs-$w.log | tee -a $LOG ;;
  tp)
    $T 200 python3 -m trident.bench.tp --out-dir /tmp/lat/tp-$w > /tmp/lat/tp-$w.log 2>&1
    say "== bench tp world $w rc=$?"; cp /tmp/lat/tp-$w/*.json $OUT/ 2>/dev/null ;;
  select)
    $T 420 python3 -m trident.bench.ccl --update-selector --factor 4 --calls 20 --reps 3 --iters 0 \
      --out-dir /tmp/lat/sel-$w > /tmp/lat/select-$w.log 2>&1
    say "== update-selector world $w rc=$?"; tail -5 /tmp/lat/select-$w.log | tee -a $LOG
    git diff --stat -- trident/ccl | tee -a $LOG
    git diff -- trident/ccl > $OUT/selector-$tag-$DAY.diff ;;
  esac
  unset CUDA_VISIBLE_DEVICES
}

for step in ${STEPS:-env tests times ccl}; do
  start=$SECONDS
  if [ "$step" = env ]; then
    { nvidia-smi -L; nvidia-smi topo -m
      python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
      git rev-parse HEAD 2>/dev/null; } 2>&1 | tee -a $LOG
  else
    for w in $WORLDS; do run_world $w $step; done
  fi
  say "== step $step: $((SECONDS - start)) s"
done
tar czf $OUT/latency-logs-${N}xh200-$DAY${TAG:-}.tgz -C /tmp/lat .
