#!/usr/bin/env bash
# Session 3 call 3: where the fused dQ's time goes — A (fused), B (rotated walk), D1 (no reds),
# D2 (no proxy fence), pass plan; two rounds.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s)
L=/tmp/c3; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv | tee $L/gpu.txt
for r in 1 2; do
for v in vA vB vD1 vD2; do
  export FLEXJIT_CACHE_DIR=/tmp/cache_$v; mkdir -p $FLEXJIT_CACHE_DIR
  timeout -k 5 100 .carry/$v/flexjit bench --backward --case main --use-cache --csv $L/${v}_$r.csv > $L/${v}_$r.log 2>&1
  el "$v $r rc=$?"
done
export FLEXJIT_CACHE_DIR=/tmp/cache_vA
timeout -k 5 100 .carry/vA/flexjit bench --backward --case main --bwd-dq pass --use-cache --csv $L/pass_$r.csv > $L/pass_$r.log 2>&1
el "pass $r rc=$?"
done
tar czf $OUT/logs.tgz -C /tmp c3
python3 - $L <<'PY'
import csv, sys, glob, os
L = sys.argv[1]
def rows(f):
    try: return {r['case']: r for r in csv.DictReader(open(f))}
    except Exception: return {}
names = ['vA','vB','vD1','vD2','pass']
print("case".ljust(18), " ".join(f"{n:>13}" for n in names))
cases = list(rows(f"{L}/vA_1.csv").keys())
for c in cases:
    out = []
    for n in names:
        vals = [rows(f"{L}/{n}_{r}.csv").get(c, {}).get('bwd_tflops', '') for r in (1, 2)]
        out.append("/".join(f"{float(v):.0f}" if v else "-" for v in vals).rjust(13))
    print(c.ljust(18), " ".join(out))
PY
el end
