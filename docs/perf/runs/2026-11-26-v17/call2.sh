#!/usr/bin/env bash
# Session 4 call 2: persistent CTAs (pairs of query tiles over every head, 2 Q buffers at d 64)
# vs base (ba6c21b) vs the build's default, main and d64; the non-default-config GPU test.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c2; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee $L/gpu.txt
export FLEXJIT_CACHE_DIR=$(mktemp -d)
B=.carry/base/flexjit; N=.carry/build/flexjit
for r in 1 2; do
  timeout -k 5 90 $B bench --only-extra --case d64 --csv $L/base_d64_$r.csv > $L/base_d64_$r.log 2>&1; el "base d64 $r rc=$?"
  timeout -k 5 90 $N bench --only-extra --case d64 --csv $L/new_d64_$r.csv > $L/new_d64_$r.log 2>&1; el "new d64 $r rc=$?"
  timeout -k 5 90 $N bench --only-extra --case d64 --persistent 1 --csv $L/pers_d64_$r.csv > $L/pers_d64_$r.log 2>&1; el "pers d64 $r rc=$?"
done
for r in 1 2; do
  timeout -k 5 120 $B bench --case main --csv $L/base_main_$r.csv > $L/base_main_$r.log 2>&1; el "base main $r rc=$?"
  timeout -k 5 120 $N bench --case main --csv $L/new_main_$r.csv > $L/new_main_$r.log 2>&1; el "new main $r rc=$?"
  timeout -k 5 120 $N bench --case main --persistent 1 --csv $L/pers_main_$r.csv > $L/pers_main_$r.log 2>&1; el "pers main $r rc=$?"
done
timeout -k 5 200 .carry/build/flexjit-tests "forward: sm90a_wgmma's non-default*" > $L/t_nondef.log 2>&1
el "tests rc=$?"; tail -3 $L/t_nondef.log; grep -B3 -A12 FAILED $L/t_nondef.log | head -40
tar czf $OUT/logs.tgz -C /tmp c2
python3 - $L <<'PY'
import csv, sys, glob
L = sys.argv[1]
def rows(f):
    try: return {r['case']: float(r['fwd_tflops']) for r in csv.DictReader(open(f)) if r.get('fwd_tflops')}
    except Exception: return {}
for grp in ('d64', 'main'):
    for tag in ('base', 'new', 'pers'):
        fs = sorted(glob.glob(f"{L}/{tag}_{grp}_*.csv"))
        data = [rows(f) for f in fs]
        if not data or not data[0]: print(grp, tag, "no data"); continue
        print(grp, tag, " ".join(f"{c}={'/'.join(f'{d.get(c, 0):.1f}' for d in data)}" for c in data[0]))
PY
el end
