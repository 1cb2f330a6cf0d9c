#!/usr/bin/env bash
# Issue 39's latency pass in one device call on a machine of 2 or 4 GPUs (one rank per GPU):
# STEPS (default: env tests times ccl ops), logs and JSON under $OUT (5 files: the log, the JSON of
# bench ccl all_reduce, of bench ops and of the warps, and a tarball of every other log).
#   env    GPUs, versions, topology
#   tests  the Lamport paths' tests at the machine's world size (and 2 on 4 GPUs):
#          all_reduce, add_rmsnorm, reduce_scatter/all_gather, broadcast/all_to_all, the
#          fault cases, graph replay and capture, the epilogue's exchanges; then
#          bench/lab/lamport_stress.py (rounds whose sizes, dtypes and grids change every
#          call)
#   ccl    bench ccl, all_reduce 1 KiB .. 1 MiB (factor 4) and the other four ops 1 .. 64
#          KiB: lamport beside one_shot, two_shot, torch symm-mem and NCCL(-symmetric),
#          eager, graph, host; then lamport's warps knob (1, 2, 4) at 1 and 16 KiB
#   times  bench/lab/kernel_times.py: per call, graph time against the time inside kernels
#          (CUPTI), for all_reduce 1/16 KiB (lamport, one_shot, torch symm-mem, NCCL) and
#          the MoE round at 1/128 tokens (DeepSeek-V3, and hidden 256: the fixed cost)
#   ops    bench ops at decode M (1, 16, 64, 128, 256): trident_epilogue_lamport beside the
#          flags epilogue, sequential and NCCL + cuBLAS
# Then: bench/make_results.py, and `trident bench ccl --update-selector` once the rows say
# where lamport wins (the shipped tables do not name it before that).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT /tmp/lat
N=$(nvidia-smi -L 2>/dev/null | wc -l)
DAY=$(date +%F)
LOG=$OUT/latency-${N}xh200-$DAY${TAG:-}.log
T="timeout -s INT -k 20"
say() { echo "$@" | tee -a $LOG; }
for step in ${STEPS:-env tests times ccl ops}; do
  start=$SECONDS
  case $step in
  env)
    { nvidia-smi -L; nvidia-smi topo -m
      python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    } 2>&1 | tee -a $LOG ;;
  tests)
    worlds=$N; [ "$N" -ge 4 ] && worlds="$N 2"
    for w in $worlds; do
      TRIDENT_TEST_WORLD_SIZES=$w $T ${TEST_TIMEOUT:-200} python3 -m pytest -q -rfE --tb=short \
        -p no:cacheprovider --timeout 150 tests/ccl/test_all_reduce.py \
        tests/ccl/test_all_reduce_rmsnorm.py tests/ccl/test_reduce_scatter.py \
        tests/ccl/test_all_gather.py tests/ccl/test_graph_replay.py \
        tests/faults/test_no_silent_garbage.py tests/faults/test_mismatched_grids.py \
        tests/ops/test_schedules.py tests/ops/test_schedule_errors.py > /tmp/lat/tests-$w.log 2>&1
      say "== pytest world $w rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" /tmp/lat/tests-$w.log | tail -12 | tee -a $LOG
      # broadcast's and all_to_all's lamport, and every lamport variant captured in a graph
      TRIDENT_TEST_WORLD_SIZES=$w $T ${TEST_TIMEOUT:-200} python3 -m pytest -q -rfE --tb=short \
        -p no:cacheprovider --timeout 150 -k "lamport or limits" tests/ccl/test_broadcast.py \
        tests/ccl/test_all_to_all.py tests/faults/test_no_silent_garbage_a2a.py \
        tests/torch_ops/test_capture_all.py > /tmp/lat/tests-more-$w.log 2>&1
      say "== pytest (broadcast, all_to_all lamport) world $w rc=$?"
      grep -E "^(FAILED|ERROR)|passed|failed" /tmp/lat/tests-more-$w.log | tail -12 | tee -a $LOG
    done
    $T 120 python3 -m bench.lab.lamport_stress --world $N --rounds 800 --flag-every 7 \
      > /tmp/lat/stress.log 2>&1
    say "== lamport stress at $N ranks rc=$?"; grep -E "^rank|FAILED" /tmp/lat/stress.log | head -6 | tee -a $LOG ;;
  ccl)
    $T 240 python3 -m trident.bench.ccl --ops all_reduce --max-size 1M --factor 4 --calls 50 \
      --reps 5 --out-dir /tmp/lat/ar > /tmp/lat/ccl-ar.log 2>&1
    say "== bench ccl all_reduce rc=$?"; cp /tmp/lat/ar/*.json $OUT/ 2>/dev/null
    $T 200 python3 -m trident.bench.ccl --ops all_gather,reduce_scatter,all_to_all,broadcast \
      --max-size 64K --factor 4 --calls 50 --reps 5 --out-dir /tmp/lat > /tmp/lat/ccl-rest.log 2>&1
    say "== bench ccl the other ops rc=$?"
    $T 120 python3 bench/lab/lamport_warps.py > $OUT/lamport-warps-${N}xh200-$DAY.json 2>/tmp/lat/warps.log
    say "== lamport warps rc=$?"; cat $OUT/lamport-warps-${N}xh200-$DAY.json | tee -a $LOG ;;
  times)
    $T 200 python3 bench/lab/kernel_times.py --calls 20 > $OUT/kernel-times-${N}xh200-$DAY.json \
      2>/tmp/lat/times.log
    say "== kernel times rc=$?"; tail -3 /tmp/lat/times.log | tee -a $LOG ;;
  ops)
    $T 300 python3 -m trident.bench.ops --m 1,16,64,128,256 --calls 30 --reps 3 \
      --budget-s 260 --out-dir /tmp/lat/ops > /tmp/lat/ops.log 2>&1
    say "== bench ops at decode M rc=$?"; cp /tmp/lat/ops/*.json $OUT/ 2>/dev/null
    tr '\r' '\n' < /tmp/lat/ops.log | grep -E "epilogue|results:" | head -40 | tee -a $LOG ;;
  esac
  say "== step $step: $((SECONDS - start)) s"
done
tar czf $OUT/latency-logs.tgz -C /tmp/lat .
