#!/usr/bin/env bash
# One device call: every benchmark suite with its baselines, results under $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
for suite in ${SUITES:-p2p ccl ops moe}; do
  timeout ${BENCH_TIMEOUT:-240} python3 -m trident.cli bench $suite --out-dir $OUT $(eval echo \${ARGS_$suite:-}) > $OUT/bench-$suite.log 2>&1
  echo "== $suite rc=$?"; grep -v '^\s*$' $OUT/bench-$suite.log | grep -v '\[#' | tail -${TAIL:-30}
done
