#!/usr/bin/env bash
# Session 6 call 7: the mask_mod's column load (kFjColLoad) and the per-tile row offset: tests,
# D=64 against the previous build (base9 = 2153990-equivalent), and chunked_local /
# dilated_sliding (192-row tiles spill 228-336 B) at 192 against 128 rows.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c7; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export FLEXJIT_CACHE_DIR=$(mktemp -d)
N=.carry/build/flexjit; B=.carry/base9/flexjit; T=.carry/build/flexjit-tests
timeout -k 5 300 $T "forward: sm90a_wgmma's 192-row tiles over block masks match the reference" "forward: uploaded block masks give the dense-mask result" > $L/t1.log 2>&1; el "union+uploaded rc=$?"; tail -2 $L/t1.log; grep -B3 -A15 FAILED $L/t1.log | head -30
for i in 1 2; do
  timeout -k 5 60 $N bench --only-extra --case d64 --csv $L/new_d64_$i.csv > /dev/null 2>&1; el "new d64 $i rc=$?"
  timeout -k 5 60 $B bench --only-extra --case d64 --csv $L/base_d64_$i.csv > /dev/null 2>&1; el "base d64 $i rc=$?"
  for m in chunked_local dilated_sliding document; do
    $N bench --shape 8,16,16,2048,64 --mods $m --csv $L/${m}_192_$i.csv > /dev/null 2>&1
    $N bench --shape 8,16,16,2048,64 --mods $m --block-m 128 --csv $L/${m}_128_$i.csv > /dev/null 2>&1
  done
  $B bench --shape 8,16,16,2048,64 --mods document --csv $L/document_base_$i.csv > /dev/null 2>&1
  el "mods $i"
done
timeout -k 5 60 compute-sanitizer --tool memcheck $N bench --repeats 1 --no-flush --use-cache --shape 2,4,2,333,64 --case document+causal > $L/mc.log 2>&1; el "memcheck rc=$?"; grep "ERROR SUMMARY" $L/mc.log
timeout -k 5 60 compute-sanitizer --tool racecheck $N bench --repeats 1 --no-flush --use-cache --shape 2,4,2,333,64 --case document+causal > $L/rc.log 2>&1; el "racecheck rc=$?"; grep "RACECHECK SUMMARY" $L/rc.log
for f in $L/*.csv; do echo "$(basename $f): $(grep -v '^impl' $f | cut -d, -f2,12 | tr '\n' ' ')"; done | sort
tar czf $OUT/logs.tgz -C /tmp c7
