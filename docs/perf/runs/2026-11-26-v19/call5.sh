#!/usr/bin/env bash
# Session 6 call 5: 192 x 64 tiles (no spills) against 192 x 128 (document 32 B, document_causal
# 4 B) for mask_mods that read a buffer per key, at D=64.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c5; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export FLEXJIT_CACHE_DIR=$(mktemp -d)
N=.carry/build/flexjit
for i in 1 2; do
  for sh in 8,16,16,2048,64 4,16,16,4096,64; do
    $N bench --shape $sh --case document+causal --csv $L/dc_def_${sh}_$i.csv > /dev/null 2>&1
    $N bench --shape $sh --case document+causal --block-m 192 --block-n 64 --csv $L/dc_64_${sh}_$i.csv > /dev/null 2>&1
    $N bench --shape $sh --mods document --csv $L/d_def_${sh}_$i.csv > /dev/null 2>&1
    $N bench --shape $sh --mods document --block-m 192 --block-n 64 --csv $L/d_64_${sh}_$i.csv > /dev/null 2>&1
    $N bench --shape $sh --mods document --block-m 128 --csv $L/d_128_${sh}_$i.csv > /dev/null 2>&1
    el "$sh $i"
  done
done
for f in $L/*.csv; do echo "$(basename $f): $(grep -v '^impl' $f | cut -d, -f2,10,11,12 | tr '\n' ' ')"; done | sort
tar czf $OUT/logs.tgz -C /tmp c5
