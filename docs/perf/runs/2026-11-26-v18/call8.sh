#!/usr/bin/env bash
# Session 5 call 8: the [gpu][forward] suite on the union-schedule build.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c8; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name --format=csv
export FLEXJIT_CACHE_DIR=$(mktemp -d)
timeout -k 5 585 .carry/build/flexjit-tests "[gpu][forward]" --durations yes > $L/t_fwd.log 2>&1
el "[gpu][forward] rc=$?"; tail -3 $L/t_fwd.log; grep -B3 -A12 FAILED $L/t_fwd.log | head -40; grep -E "^[0-9.]+ s: " $L/t_fwd.log | sort -rn | head -20
tar czf $OUT/logs.tgz -C /tmp c8
