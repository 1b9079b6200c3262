#!/usr/bin/env bash
# Session 3 call 2: dQ inside the dK/dV kernel (dq_atomic) — quick correctness, bench A/B, anchors.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s)
L=/tmp/c2; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv | tee $L/gpu.txt
export FLEXJIT_CACHE_DIR=$(mktemp -d)
timeout -k 5 200 .carry/build/flexjit-tests "backward: GQA*" > $L/t_gqa.log 2>&1
el "gqa test rc=$?"; tail -3 $L/t_gqa.log
grep -E "FAILED|rel [0-9.e+-]+ max" $L/t_gqa.log | grep -i "sm90a\|FAILED" | head -20
timeout -k 5 100 .carry/build/flexjit bench --backward --case main --csv $L/atomic.csv > $L/atomic.log 2>&1
el "bench atomic rc=$?"
timeout -k 5 100 .carry/build/flexjit bench --backward --case main --bwd-dq pass --use-cache --csv $L/pass.csv > $L/pass.log 2>&1
el "bench pass rc=$?"
timeout -k 5 150 .carry/build/flexjit-tests "backward: every standard mod matches the fp64 CPU backward" > $L/t_std.log 2>&1
el "std test rc=$?"; tail -3 $L/t_std.log
grep -E "FAILED" -A12 $L/t_std.log | head -40
tar czf $OUT/logs.tgz -C /tmp c2
python3 - $L <<'PY'
import csv, sys
L = sys.argv[1]
def rows(f):
    try: return list(csv.DictReader(open(f)))
    except Exception as e: return []
a = {r['case']: r for r in rows(f"{L}/atomic.csv")}
p = {r['case']: r for r in rows(f"{L}/pass.csv")}
tm = {r['case']: r for r in rows(f".carry/c1anchors.csv") if r['impl'] == 'torch-flex' and r['Hq'] == '16' and r['Sq'] == '4096' and r['D'] == '128'}
print("case: bwd atomic / pass / torch  ratio(atomic) ratio(pass)")
for c in a:
    ba = float(a[c]['bwd_tflops'] or 'nan'); bp = float(p.get(c, {}).get('bwd_tflops') or 'nan')
    t = tm.get(c); tb = float(t['bwd_tflops']) if t else float('nan')
    print(f"{c:18} {ba:7.1f} {bp:7.1f} {tb:7.1f}  {ba/tb:5.2f} {bp/tb:5.2f}")
PY
el end
