#!/usr/bin/env bash
# Session 3 call 4: dQ in the dK/dV kernel by bulk reductions — tests, bench vs the pass plan.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s)
L=/tmp/c4; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv | tee $L/gpu.txt
export FLEXJIT_CACHE_DIR=$(mktemp -d)
for r in 1 2; do
  timeout -k 5 100 .carry/build/flexjit bench --backward --case main --use-cache --csv $L/bulk_$r.csv > $L/bulk_$r.log 2>&1
  el "bulk $r rc=$?"
  timeout -k 5 100 .carry/build/flexjit bench --backward --case main --bwd-dq pass --use-cache --csv $L/pass_$r.csv > $L/pass_$r.log 2>&1
  el "pass $r rc=$?"
done
timeout -k 5 200 .carry/build/flexjit-tests "backward: GQA*" > $L/t_gqa.log 2>&1
el "gqa test rc=$?"; tail -3 $L/t_gqa.log; grep -A12 FAILED $L/t_gqa.log | head -30
timeout -k 5 150 .carry/build/flexjit-tests "backward: every standard mod matches the fp64 CPU backward" > $L/t_std.log 2>&1
el "std test rc=$?"; tail -3 $L/t_std.log; grep -A12 FAILED $L/t_std.log | head -30
tar czf $OUT/logs.tgz -C /tmp c4
python3 - $L <<'PY'
import csv, sys
L = sys.argv[1]
def rows(f):
    try: return {r['case']: r for r in csv.DictReader(open(f))}
    except Exception: return {}
tm = {r['case']: r for r in csv.DictReader(open(".carry/c1anchors.csv")) if r['impl'] == 'torch-flex' and r['Hq'] == '16' and r['Sq'] == '4096' and r['D'] == '128'}
print("case bulk(1/2) pass(1/2) torch(call1)")
for c in rows(f"{L}/bulk_1.csv"):
    b = [float(rows(f"{L}/bulk_{r}.csv")[c]['bwd_tflops']) for r in (1, 2)]
    p = [float(rows(f"{L}/pass_{r}.csv")[c]['bwd_tflops']) for r in (1, 2)]
    t = float(tm[c]['bwd_tflops'])
    print(f"{c:18} {b[0]:6.1f}/{b[1]:6.1f} {p[0]:6.1f}/{p[1]:6.1f} {t:6.1f}  {max(b)/t:5.2f} {max(p)/t:5.2f}")
PY
el end
