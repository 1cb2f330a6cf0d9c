#!/usr/bin/env bash
# One device call (about 6 minutes on 2x H200, at most 9.5): the ccl, ops and moe suites,
# every implementation timed eagerly, from a CUDA graph and on the host, with their
# baselines; then a short `trident tune` and `trident info` to check that the tuned table
# is found and used. Back in $OUT: results.tar.gz (JSON, PNG, one log per step; rewritten
# after each step, so a step that runs out of time loses only itself), ccl-tables.json
# (the collective selector's eager and graph tables from this run: copy it over
# trident/ccl/tables.json) and crossover.json (the same for trident/ops/crossover.json).
# Usage there: OUT=... bash bench/gpu_bench.sh   (SUITES="ccl" or ARGS_ccl=... to narrow;
# TAG=-2gpu names the logs of a second pass, e.g. under CUDA_VISIBLE_DEVICES=0,1)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; R=/tmp/results; mkdir -p $OUT $R
: "${ARGS_ccl=--max-size 64M --factor 4 --update-selector $OUT/ccl-tables.json}"
: "${ARGS_ops=--layers llama3-70b --m 256,4096 --update-crossover $OUT/crossover.json}"
: "${ARGS_moe=--models deepseek-v3,qwen3-30b-a3b --tokens 1,128,4096}"
: "${ARGS_p2p=}"
declare -A LIMIT=([ccl]=${LIMIT_ccl:-200} [ops]=${LIMIT_ops:-150} [moe]=${LIMIT_moe:-120} [p2p]=${LIMIT_p2p:-60})

step() {   # step NAME LIMIT_S COMMAND...: run, log to $R/NAME.log, print its tail, archive
  local name=$1 limit=$2 start=$SECONDS; shift 2
  timeout $limit "$@" > $R/$name.log 2>&1
  echo "== $name rc=$? $((SECONDS - start))s"
  grep -v '^\s*$' $R/$name.log | tr '\r' '\n' | grep -v '\[#' | tail -${TAIL:-30}
  tar czf $OUT/results.tar.gz -C $R .
}

for suite in ${SUITES:-ccl ops moe}; do
  args_var="ARGS_$suite"
  step bench-$suite${TAG:-} ${LIMIT[$suite]:-200} python3 -m trident bench $suite --out-dir $R ${!args_var}
done
if [ -z "${NO_TUNE:-}" ]; then
  export TRIDENT_CACHE_DIR=$R/cache
  step tune 90 python3 -m trident tune --quick --max-size 1M
  step info 30 python3 -m trident info
fi
