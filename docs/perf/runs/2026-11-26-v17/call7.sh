#!/usr/bin/env bash
# Session 4 call 7: sanitizers (default, persistent d 128, block_m 192 persistent) and the
# [gpu][forward] suite on 2f? (persistent two-buffer only; maskless d 64 block_m 192).
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c7; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee $L/gpu.txt
export FLEXJIT_CACHE_DIR=$(mktemp -d)
N=.carry/build/flexjit
run_san() {  # tag, extra args
  local tag=$1; shift
  for tool in racecheck memcheck synccheck; do
    timeout -k 3 90 compute-sanitizer --tool $tool --error-exitcode 3 $N bench --small --repeats 1 --no-flush --use-cache "$@" > $L/san_${tool}_$tag.log 2>&1
    el "$tool $tag rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $L/san_${tool}_$tag.log | sort | uniq -c | head -2
  done
}
run_san default --case noop,causal,alibi+causal,document+causal,relbias+causal,softcap30+causal
run_san pers --persistent 1 --case noop,causal,alibi+causal,document+causal,relbias+causal,softcap30+causal
run_san bm192 --persistent 1 --block-m 192 --case noop
left=$(( 575 - ($(date +%s) - T0) ))
timeout -k 5 $left .carry/build/flexjit-tests "[gpu][forward]" > $L/t_fwd.log 2>&1
el "[gpu][forward] rc=$? (limit $left)"; tail -3 $L/t_fwd.log; grep -B3 -A12 FAILED $L/t_fwd.log | head -30
tar czf $OUT/logs.tgz -C /tmp c7
el end
