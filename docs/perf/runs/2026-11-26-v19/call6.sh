#!/usr/bin/env bash
# Session 6 call 6: graph capture and the kept schedule; the tuner with 192 over masks.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c6; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export FLEXJIT_CACHE_DIR=$(mktemp -d)
T=.carry/build/flexjit-tests
timeout -k 5 120 $T "forward: 192-row tiles over a block mask in a captured CUDA graph" > $L/graph.log 2>&1; el "graph rc=$?"; tail -2 $L/graph.log; grep -B5 -A20 FAILED $L/graph.log | head -50
timeout -k 5 120 $T "forward: a block mask keeps its union schedule for later calls until its arrays change" > $L/kept.log 2>&1; el "kept rc=$?"; tail -2 $L/kept.log
timeout -k 5 330 $T "[gpu][tune]" > $L/tune.log 2>&1; el "tune rc=$?"; tail -2 $L/tune.log; grep -B5 -A20 FAILED $L/tune.log | head -40
FLEXJIT_PRINT_AUTOTUNING=1 timeout -k 5 120 .carry/build/flexjit bench --shape 8,16,16,2048,64 --case causal,document+causal --autotune search --csv $L/tuned.csv > $L/tuned.log 2>&1; el "tuned rc=$?"; grep -v '^impl' $L/tuned.csv | cut -d, -f2,12- ; grep -c "block_m=192" $L/tuned.log
tar czf $OUT/logs.tgz -C /tmp c6
