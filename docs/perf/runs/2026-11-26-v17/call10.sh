#!/usr/bin/env bash
# Session 4 call 10: [gpu][backward] on f0cc9fe (the shared headers changed; the backward kernels did not).
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c10; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export FLEXJIT_CACHE_DIR=$(mktemp -d)
timeout -k 5 520 .carry/build/flexjit-tests "[gpu][backward]" > $L/t_bwd.log 2>&1
el "[gpu][backward] rc=$?"; tail -3 $L/t_bwd.log; grep -B3 -A12 FAILED $L/t_bwd.log | head -30
tar czf $OUT/logs.tgz -C /tmp c10
