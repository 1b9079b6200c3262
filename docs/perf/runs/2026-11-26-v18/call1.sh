#!/usr/bin/env bash
# Session 5 call 1: where D=64 causal loses (per-query-tile cost vs per-KV-tile cost, ncu).
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c1; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $L/gpu.txt
export FLEXJIT_CACHE_DIR=$(mktemp -d)
N=.carry/build/flexjit
for bs in "32,16,16,512" "16,16,16,1024" "8,16,16,2048" "4,16,16,4096" "2,16,16,8192"; do
  timeout -k 5 60 $N bench --shape $bs,64 --case noop,causal --use-cache --csv $L/sweep_$bs.csv > $L/sweep_$bs.log 2>&1; el "sweep $bs rc=$?"
done
FULL='param w: i32 = 1000000; mask_mod = q_idx - kv_idx < w'
timeout -k 5 60 $N bench --shape 8,16,16,2048,64 --mods "$FULL" --use-cache --csv $L/full.csv > $L/full.log 2>&1; el "full rc=$?"
timeout -k 5 60 $N bench --shape 8,16,16,2048,64 --case causal --persistent 0 --use-cache --csv $L/np.csv > $L/np.log 2>&1; el "np rc=$?"
cat $L/sweep_*.csv $L/full.csv $L/np.csv | grep -v '^impl' | cut -d, -f2-8,10-12
SEC="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section SourceCounters --section LaunchStats --section ComputeWorkloadAnalysis"
prof() {
  local tag=$1; shift
  timeout -k 5 150 ncu -k regex:^flexjit_forward --launch-skip 2 --launch-count 1 $SEC -o $L/ncu_$tag -f "$@" --repeats 3 --no-flush --use-cache > $L/ncu_$tag.log 2>&1
  el "ncu $tag rc=$?"
  ncu -i $L/ncu_$tag.ncu-rep --page details --csv > $L/ncu_${tag}_details.csv 2>&1
  ncu -i $L/ncu_$tag.ncu-rep --page source --csv --print-source sass > $L/ncu_${tag}_sass.csv 2>&1
  el "export $tag rc=$?"
}
prof causal $N bench --shape 8,16,16,2048,64 --case causal
prof noop $N bench --shape 8,16,16,2048,64 --case noop
prof full $N bench --shape 8,16,16,2048,64 --mods "$FULL"
tar czf $OUT/logs.tgz -C /tmp c1
el end
