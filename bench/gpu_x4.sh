#!/usr/bin/env bash
# One device call on a 4-GPU machine (at most about 8.5 minutes), in three phases:
#   1. all 4 GPUs: the large-message sweep (bench.lab.sweep) and the MoE suite at 4 ranks;
#   2. in parallel: GPUs 0,1 -- ccl fuzz, fused-op GEMM-core A/B (TRIDENT_GEMM=classic|tma),
#      `trident bench tp`, new-feature tests; GPUs 2,3 -- the soak (2 ranks);
#      GPU 2 after the soak -- the GEMM core suite (split-K, host descriptors);
#   3. back in $OUT: one log per step and results.tar.gz (JSON, PNG).
# Usage there: OUT=... bash bench/gpu_x4.sh   (PHASES="1 2" to narrow)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; R=/tmp/results-x4; mkdir -p $OUT $R

step() {   # step NAME LIMIT_S COMMAND...: run with a time limit, log to $R/NAME.log
  local name=$1 limit=$2 start=$SECONDS; shift 2
  timeout $limit "$@" > $R/$name.log 2>&1
  echo "== $name rc=$? $((SECONDS - start))s"
}

pair_a() {   # GPUs 0,1
  export CUDA_VISIBLE_DEVICES=0,1 TRIDENT_TEST_WORLD_SIZES=2 TRIDENT_FUZZ_WORLD_SIZES=2
  step fuzz-2gpu 70 python3 -m pytest -q -p no:cacheprovider tests/fuzz/test_ccl.py --cases 40
  for g in classic tma; do
    TRIDENT_GEMM=$g step ops-ab-$g 60 python3 -m trident bench ops --world-size 2 \
      --layers llama3-70b --m 8192 --out-dir $R/ab-gemm-$g
  done
  step bench-tp-2gpu 60 python3 -m trident bench tp --world-size 2 --out-dir $R
  step new-tests-2gpu 90 python3 -m pytest -q -p no:cacheprovider --timeout 45 \
    tests/ccl/test_all_reduce_rmsnorm.py tests/ccl/test_knobs.py tests/moe/test_fp8_dispatch.py \
    tests/ccl/test_all_to_all.py tests/torch_ops
}

pair_b() {   # GPUs 2,3, then GPU 2 alone
  export CUDA_VISIBLE_DEVICES=2,3
  step soak-2gpu 150 python3 -m bench.lab.soak --world 2
  export CUDA_VISIBLE_DEVICES=2
  step gemm-1gpu 120 python3 -m trident.bench.gemm --out-dir $R --write-table $R/gemm_table.json
}

for phase in ${PHASES:-1 2}; do
  case $phase in
    1) step sweep-4gpu 120 python3 -m bench.lab.sweep --world-size 4 --out-dir $R
       step bench-moe-4gpu 60 python3 -m trident bench moe --out-dir $R \
         --models deepseek-v3 --tokens 128,4096 ;;
    2) pair_a & pair_b & wait ;;
  esac
  tar czf $OUT/results.tar.gz -C $R .
done
for f in $R/*.log; do echo "--- $(basename $f)"; grep -v '^\s*$' $f | tr '\r' '\n' | grep -v '\[#' | tail -${TAIL:-6}; done
