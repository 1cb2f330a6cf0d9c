#!/usr/bin/env bash
# The whole test suite on GPUs, one world size per worker pool, resumable across device calls.
#
# Workers take test files from one queue per world (a file is claimed with an atomic mkdir)
# and run pytest on it, at the world size of their pool, on one GPU, ranks sharing it under
# one MPS daemon, each rank capped so that every rank of every worker on a GPU adds up to at
# most 100 % of it (persistent grids must stay resident). A file whose pytest finished has
# its log and exit status under $STATE/w<W>/; a later call (on a warm machine: $STATE and
# TRITON_CACHE_DIR are git-ignored folders of the tree, kept between calls) skips it, so the
# suite can be split over several calls. At DEADLINE seconds no new file is started; a
# running pytest is interrupted (SIGINT: it prints what failed so far) and its file is left
# for the next call.
#
#   POOLS     ';'-separated pools "world:gpu:workers:percent per rank"
#             (default: 4 ranks x2 workers on GPU 0 at 11 %, 2 ranks x3 and 1 rank x3 on GPU 1;
#             with one GPU visible, every pool on GPU 0: 4 ranks x1, 2 x2, 1 x2, at 11 %)
#   FIRST     test files to queue first (the rest follow in path order)
#   DEADLINE  seconds after which nothing new starts (default 480)
#   SIDE      a command run beside the workers (e.g. the soak), its output in $OUT/side.log
#   TREE      the tree's name for the summary (default: git log's HEAD, which a device copy
#             of the working tree may not have moved: pass the hash sent)
#   ONCE      files that run in the smallest pool world only (default: every test file that
#             names no rank pool and no world size, outside the folders whose conftest
#             parametrizes by world; its tests are the same at every world). Elsewhere the
#             summary lists them as "once", never as passed.
# $OUT/suite.tgz holds every file's log; $OUT/suite-summary.txt says what ran, where, with
# what result, and what is left.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PATH=$PATH:/usr/local/nvidia/bin
export TRITON_CACHE_DIR=$PWD/.triton-cache
OUT=${OUT:-/tmp/out}; STATE=$PWD/.triton-cache/suite-state; mkdir -p $OUT $STATE
GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
if [ "${GPUS:-0}" -le 1 ]; then POOLS=${POOLS:-"4:0:1:11;2:0:2:11;1:0:2:11"}; fi
POOLS=${POOLS:-"4:0:2:11;2:1:3:11;1:1:3:10"}
DEADLINE=${DEADLINE:-480}
T0=$SECONDS
ONCE=${ONCE-$(grep -rL -E "WORLD_SIZES|WORLDS|\bpool\b|get_pool" --include='test_*.py' tests \
  | grep -v -E "^tests/(torch_dist|compat)/" | sort)}
FILES=$( (for f in ${FIRST:-}; do echo $f; done; find tests -name 'test_*.py' | sort) | awk '!seen[$0]++')

worker() {  # world gpu percent name
  local w=$1 gpu=$2 pct=$3 name=$4 f key rc left
  for f in $FILES; do
    key=$(echo $f | tr / _)
    [ -e $STATE/w$w/$key.rc ] && continue
    if [ "$w" != "$FIRST_WORLD" ] && echo " $ONCE " | tr '\n' ' ' | grep -q " $f "; then continue; fi
    mkdir $STATE/w$w/$key.claim 2>/dev/null || continue
    left=$((DEADLINE - (SECONDS - T0)))
    if [ $left -lt 20 ]; then rmdir $STATE/w$w/$key.claim; break; fi
    CUDA_VISIBLE_DEVICES=$gpu TRIDENT_TEST_WORLD_SIZES=$w CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct \
      timeout -s INT -k 20 $left python3 -m pytest -q -rfEs --tb=short -p no:cacheprovider \
      --timeout ${PER_TEST:-150} $f > $STATE/w$w/$key.log 2>&1
    rc=$?
    echo "$name $(date +%T) rc=$rc $f" >> $STATE/w$w/worker.log
    # 124/130: cut off at the deadline (SIGINT gives 2 when pytest reports the interrupt)
    if [ $rc -eq 124 ] || [ $rc -eq 130 ] || [ $rc -eq 137 ] || grep -q "KeyboardInterrupt" $STATE/w$w/$key.log; then
      mv $STATE/w$w/$key.log $STATE/w$w/$key.cut.log
    else
      echo $rc > $STATE/w$w/$key.rc
    fi
    rmdir $STATE/w$w/$key.claim
  done
}

rm -rf $STATE/w*/*.claim
nvidia-cuda-mps-control -d && echo "MPS daemon started"
if [ -n "${SIDE:-}" ]; then (eval "$SIDE") > $OUT/side.log 2>&1 & side=$!; fi
pids=()
IFS=';' read -ra pools <<< "$POOLS"
FIRST_WORLD=$(for p in "${pools[@]}"; do echo ${p%%:*}; done | sort -n | head -1)  # ONCE's world
for p in "${pools[@]}"; do
  IFS=: read -r w gpu n pct <<< "$p"; mkdir -p $STATE/w$w
  for i in $(seq 1 $n); do worker $w $gpu $pct "w$w.$i@gpu$gpu" & pids+=($!); done
done
wait "${pids[@]}"
[ -n "${SIDE:-}" ] && wait $side
echo quit | nvidia-cuda-mps-control

# summary: per world, files done / left, and pytest's last line of each file
S=$OUT/suite-summary.txt
{ echo "suite at ${TREE:-$(git log --oneline -1 2>/dev/null | cut -c1-60)}, this call $((SECONDS - T0)) s, pools $POOLS"
  for p in "${pools[@]}"; do
    w=${p%%:*}; done_n=0; left=()
    once_n=0
    for f in $FILES; do
      key=$(echo $f | tr / _)
      if [ -e $STATE/w$w/$key.rc ]; then done_n=$((done_n + 1))
      elif [ "$w" != "$FIRST_WORLD" ] && echo " $ONCE " | tr '\n' ' ' | grep -q " $f "; then once_n=$((once_n + 1))
      else left+=($f); fi
    done
    echo "== world $w ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)): $done_n files done, $once_n world-independent (run at world $FIRST_WORLD only), ${#left[@]} left"
    for f in $FILES; do
      key=$(echo $f | tr / _); [ -e $STATE/w$w/$key.rc ] || continue
      echo "rc=$(cat $STATE/w$w/$key.rc) $f: $(grep -E '(passed|failed|skipped|error|deselected|no tests ran)' $STATE/w$w/$key.log | tail -1)"
      grep -E "^(FAILED|ERROR)" $STATE/w$w/$key.log | sed 's/^/    /'
    done
    echo "left: ${left[*]}"
  done; } > $S
cat $S | grep -E "^==|rc=[^0]|FAILED|ERROR|^left" | head -80
tar czf $OUT/suite.tgz -C $STATE .
