#!/usr/bin/env bash
# Session 4 call 6: the slot read's proxy fence: sanitizers on the small cases (persistent on and
# off), the [gpu] cases outside forward / backward / decode (tuning, buffers, API), d64 bench.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c6; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee $L/gpu.txt
export FLEXJIT_CACHE_DIR=$(mktemp -d)
N=.carry/build/flexjit
for p in 1 0; do for tool in racecheck memcheck synccheck; do
  timeout -k 3 90 compute-sanitizer --tool $tool --error-exitcode 3 $N bench --small --repeats 1 --no-flush --use-cache --persistent $p \
    --case noop,causal,alibi+causal,document+causal,relbias+causal,softcap30+causal > $L/san_${tool}_$p.log 2>&1
  el "$tool persistent=$p rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $L/san_${tool}_$p.log | sort | uniq -c | head -3
done; done
timeout -k 5 60 $N bench --only-extra --case d64 --csv $L/d64.csv > $L/d64.log 2>&1; el "d64 rc=$?"; tail -6 $L/d64.log
left=$(( 560 - ($(date +%s) - T0) ))
timeout -k 5 $left .carry/build/flexjit-tests "[gpu]~[forward]~[backward]~[decode]" > $L/t_rest.log 2>&1
el "[gpu] rest rc=$? (limit $left)"; tail -3 $L/t_rest.log; grep -B3 -A12 FAILED $L/t_rest.log | head -40
tar czf $OUT/logs.tgz -C /tmp c6
el end
