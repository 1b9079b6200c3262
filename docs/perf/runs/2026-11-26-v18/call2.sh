#!/usr/bin/env bash
# Session 5 call 2: the union schedule (block_m 192 over block masks): GPU test, sanitizers,
# d64 bench new vs base (HEAD kernels), full-mask kernel.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c2; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $L/gpu.txt
export FLEXJIT_CACHE_DIR=$(mktemp -d)
N=.carry/build/flexjit; B=.carry/base5/flexjit
timeout -k 5 200 .carry/build/flexjit-tests "forward: sm90a_wgmma's 192-row tiles over block masks match the reference" > $L/t_union.log 2>&1
el "t_union rc=$?"; tail -3 $L/t_union.log; grep -B2 -A14 FAILED $L/t_union.log | head -60
for i in 1 2; do
  timeout -k 5 60 $N bench --only-extra --case d64 --csv $L/new_d64_$i.csv > $L/new_d64_$i.log 2>&1; el "new d64 $i rc=$?"
  timeout -k 5 60 $B bench --only-extra --case d64 --csv $L/base_d64_$i.csv > $L/base_d64_$i.log 2>&1; el "base d64 $i rc=$?"
done
FULL='param w: i32 = 1000000; mask_mod = q_idx - kv_idx < w'
timeout -k 5 60 $N bench --shape 8,16,16,2048,64 --mods "$FULL" --csv $L/new_full.csv > $L/new_full.log 2>&1; el "full rc=$?"
timeout -k 5 60 $N bench --shape 4,16,16,4096,64 --case noop,causal,sliding1024,prefix_lm,document+causal,softcap30+causal,relbias+causal --csv $L/new_s4k.csv > $L/new_s4k.log 2>&1; el "s4k rc=$?"
timeout -k 5 60 $B bench --shape 4,16,16,4096,64 --case noop,causal,sliding1024,prefix_lm,document+causal,softcap30+causal,relbias+causal --csv $L/base_s4k.csv > $L/base_s4k.log 2>&1; el "base s4k rc=$?"
for f in $L/*d64*.csv $L/new_full.csv $L/*s4k.csv; do echo "$(basename $f): $(grep -v '^impl' $f | cut -d, -f2,8,12 | tr '\n' ' ')"; done
for tool in racecheck memcheck synccheck; do
  timeout -k 3 100 compute-sanitizer --tool $tool --error-exitcode 3 $N bench --shape 2,4,2,333,64 --block-m 192 --repeats 1 --no-flush --use-cache > $L/san_$tool.log 2>&1
  el "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $L/san_$tool.log | sort | uniq -c | head -2
done
tar czf $OUT/logs.tgz -C /tmp c2
el end
