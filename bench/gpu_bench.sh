#!/usr/bin/env bash
# One device call: benchmark suites with their baselines; everything lands in
# $OUT/results.tar.gz (JSON + PNG) and $OUT/bench.log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; R=/tmp/results; mkdir -p $OUT $R
for suite in ${SUITES:-p2p ccl ops moe}; do
  args_var="ARGS_$suite"
  timeout ${BENCH_TIMEOUT:-200} python3 -m trident.cli bench $suite --out-dir $R ${!args_var:-} \
    > $R/bench-$suite.log 2>&1
  echo "== $suite rc=$?"; grep -v '^\s*$' $R/bench-$suite.log | tr '\r' '\n' | grep -v '\[#' | tail -${TAIL:-40}
done
tar czf $OUT/results.tar.gz -C $R .
