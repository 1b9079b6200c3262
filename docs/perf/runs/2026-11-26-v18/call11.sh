#!/usr/bin/env bash
# Session 5 call 11: the overlapped loop's steps as shared lambdas (first_s, next_s_pv, last_pv):
# bench new vs 35e4a6d (main, d64, S=4096 d64) interleaved, and the forward tests that run the
# union and the 192 configs.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c11; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export FLEXJIT_CACHE_DIR=$(mktemp -d)
N=.carry/build/flexjit; B=.carry/base6/flexjit
for i in 1 2; do
  timeout -k 5 90 $N bench --case main --csv $L/new_main_$i.csv > /dev/null 2>&1; el "new main $i rc=$?"
  timeout -k 5 90 $B bench --case main --csv $L/base_main_$i.csv > /dev/null 2>&1; el "base main $i rc=$?"
  timeout -k 5 60 $N bench --only-extra --case d64 --csv $L/new_d64_$i.csv > /dev/null 2>&1; el "new d64 $i rc=$?"
  timeout -k 5 60 $B bench --only-extra --case d64 --csv $L/base_d64_$i.csv > /dev/null 2>&1; el "base d64 $i rc=$?"
done
for f in $L/*.csv; do echo "$(basename $f): $(grep -v '^impl' $f | cut -d, -f2,12 | tr '\n' ' ')"; done
timeout -k 5 250 .carry/build/flexjit-tests "forward: sm90a_wgmma's 192-row tiles over block masks match the reference,forward: sm90a_wgmma's non-default configs match the reference,forward: every standard mod matches the reference" > $L/t.log 2>&1
el "tests rc=$?"; tail -2 $L/t.log; grep -B3 -A12 FAILED $L/t.log | head -30
tar czf $OUT/logs.tgz -C /tmp c11
