#!/usr/bin/env bash
# Session 6 call 2: the union schedule kept with the mask — tests, then D=64 against b7973d8
# (base7; d6e4f45 measured neutral against it) interleaved.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c2; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export FLEXJIT_CACHE_DIR=$(mktemp -d)
N=.carry/build/flexjit; B=.carry/base7/flexjit
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout -k 5 280 .carry/build/flexjit-tests "forward: a block mask keeps its union schedule across calls, streams and rewrites,forward: sm90a_wgmma's 192-row tiles over block masks match the reference,forward: uploaded block masks give the dense-mask result" > $L/t.log 2>&1
el "tests rc=$?"; tail -3 $L/t.log; grep -B3 -A15 FAILED $L/t.log | head -40
for i in 1 2; do
  timeout -k 5 60 $N bench --only-extra --case d64 --csv $L/new_d64_$i.csv > /dev/null 2>&1; el "new d64 $i rc=$?"
  timeout -k 5 60 $B bench --only-extra --case d64 --csv $L/base_d64_$i.csv > /dev/null 2>&1; el "base d64 $i rc=$?"
done
timeout -k 5 60 compute-sanitizer --tool memcheck $N bench --repeats 2 --no-flush --use-cache --shape 2,4,2,333,64 > $L/memcheck.log 2>&1; el "memcheck rc=$?"; tail -3 $L/memcheck.log
for f in $L/*.csv; do echo "$(basename $f): $(grep -v '^impl' $f | cut -d, -f2,12 | tr '\n' ' ')"; done
tar czf $OUT/logs.tgz -C /tmp c2
