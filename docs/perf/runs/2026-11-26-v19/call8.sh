#!/usr/bin/env bash
# Session 6 call 8: the whole [gpu][forward] suite on 49f3e08 (the column load).
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c8; mkdir -p $L
export FLEXJIT_CACHE_DIR=$(mktemp -d)
timeout -k 5 570 .carry/build/flexjit-tests "[gpu][forward]" > $L/fwd.log 2>&1
echo "[$(( $(date +%s) - T0 ))s] [gpu][forward] rc=$?"; tail -3 $L/fwd.log; grep -B3 -A15 FAILED $L/fwd.log | head -40
tar czf $OUT/logs.tgz -C /tmp c8
