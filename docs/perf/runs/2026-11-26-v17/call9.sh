#!/usr/bin/env bash
# Session 4 call 9: [gpu][decode] (chunked prefill runs the sm_80 forward, whose FjFwdArgs grew)
# on f0cc9fe.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c9; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export FLEXJIT_CACHE_DIR=$(mktemp -d)
timeout -k 5 400 .carry/build/flexjit-tests "[gpu][decode]" > $L/t_decode.log 2>&1
el "[gpu][decode] rc=$?"; tail -3 $L/t_decode.log; grep -B3 -A12 FAILED $L/t_decode.log | head -30
tar czf $OUT/logs.tgz -C /tmp c9
