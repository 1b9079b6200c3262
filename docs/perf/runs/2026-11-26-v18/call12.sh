#!/usr/bin/env bash
# Session 5 call 12: review pass (redundant broadcasts dropped, the union view through
# block_mask_args): the union and non-default-config tests, d64 against b7973d8 interleaved.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c12; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export FLEXJIT_CACHE_DIR=$(mktemp -d)
N=.carry/build/flexjit; B=.carry/base7/flexjit
timeout -k 5 200 .carry/build/flexjit-tests "forward: sm90a_wgmma's 192-row tiles over block masks match the reference,forward: uploaded block masks give the dense-mask result" > $L/t.log 2>&1
el "tests rc=$?"; tail -2 $L/t.log; grep -B3 -A12 FAILED $L/t.log | head -30
for i in 1 2; do
  timeout -k 5 60 $N bench --only-extra --case d64 --csv $L/new_d64_$i.csv > /dev/null 2>&1; el "new d64 $i rc=$?"
  timeout -k 5 60 $B bench --only-extra --case d64 --csv $L/base_d64_$i.csv > /dev/null 2>&1; el "base d64 $i rc=$?"
done
for f in $L/*.csv; do echo "$(basename $f): $(grep -v '^impl' $f | cut -d, -f2,12 | tr '\n' ' ')"; done
tar czf $OUT/logs.tgz -C /tmp c12
