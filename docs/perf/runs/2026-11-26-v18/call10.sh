#!/usr/bin/env bash
# Session 5 call 10: the other [gpu] cases (tune, buffers, block masks, driver, ...) and the
# union-schedule test on the final build (35e4a6d).
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c10; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export FLEXJIT_CACHE_DIR=$(mktemp -d)
timeout -k 5 120 .carry/build/flexjit-tests "forward: sm90a_wgmma's 192-row tiles over block masks match the reference" > $L/t_union.log 2>&1
el "t_union rc=$?"; tail -2 $L/t_union.log
timeout -k 5 440 .carry/build/flexjit-tests "[gpu]~[forward]~[backward]~[decode]" --durations yes > $L/t_other.log 2>&1
el "other [gpu] rc=$?"; tail -3 $L/t_other.log; grep -B3 -A12 FAILED $L/t_other.log | head -40
tar czf $OUT/logs.tgz -C /tmp c10
