#!/usr/bin/env bash
# Session 5 call 5: ncu of the d64 kernels, base (HEAD kernels) vs new (union schedule build).
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c5; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export FLEXJIT_CACHE_DIR=$(mktemp -d)
N=.carry/build/flexjit; B=.carry/base5/flexjit
SEC="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section LaunchStats --section SourceCounters"
prof() {
  local tag=$1; shift
  timeout -k 5 150 ncu -k regex:^flexjit_forward$ --launch-skip 2 --launch-count 1 $SEC -o $L/ncu_$tag -f "$@" --repeats 3 --no-flush --use-cache > $L/ncu_$tag.log 2>&1
  el "ncu $tag rc=$?"
  ncu -i $L/ncu_$tag.ncu-rep --page details --csv > $L/ncu_${tag}_details.csv 2>&1
  ncu -i $L/ncu_$tag.ncu-rep --page source --csv --print-source sass > $L/ncu_${tag}_sass.csv 2>&1
}
prof noop_base $B bench --shape 8,16,16,2048,64 --case noop
prof noop_new $N bench --shape 8,16,16,2048,64 --case noop
prof causal_base $B bench --shape 8,16,16,2048,64 --case causal
prof causal_new $N bench --shape 8,16,16,2048,64 --case causal
prof causal_new128 $N bench --shape 8,16,16,2048,64 --case causal --block-m 128
rm -f $L/*.ncu-rep
tar czf $OUT/logs.tgz -C /tmp c5
el end
