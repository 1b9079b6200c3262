#!/usr/bin/env bash
# Session 3 call 5 (final): main f8d0286+ — backward bench (fused dQ default, then the second
# pass), the anchors, compute-sanitizer racecheck / synccheck on the small backward, the
# [gpu][backward] suite.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s)
L=/tmp/c5; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv | tee $L/gpu.txt
export FLEXJIT_CACHE_DIR=$(mktemp -d)
timeout -k 5 100 .carry/build/flexjit bench --backward --case main --csv $L/fused.csv > $L/fused.log 2>&1
el "bench fused rc=$?"
timeout -k 5 100 .carry/build/flexjit bench --backward --case main --bwd-dq pass --use-cache --csv $L/pass.csv > $L/pass.log 2>&1
el "bench pass rc=$?"
timeout -k 5 150 python3 .carry/anchors/torch_flex_bench.py --csv $L/anchors_main.csv > $L/anchors_main.log 2>&1
el "anchors rc=$?"
for tool in racecheck synccheck; do
  timeout -k 3 60 compute-sanitizer --tool $tool --error-exitcode 3 .carry/build/flexjit bench --backward --small --repeats 1 --no-flush --use-cache \
    --case causal,alibi+causal,relbias+causal,document+causal > $L/san_$tool.log 2>&1
  el "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $L/san_$tool.log | sort | uniq -c | head -4
done
left=$(( 575 - ($(date +%s) - T0) ))
timeout -k 5 $left .carry/build/flexjit-tests "[gpu][backward]" > $L/t_bwd.log 2>&1
el "[gpu][backward] rc=$? (limit $left)"; tail -3 $L/t_bwd.log; grep -B2 -A14 FAILED $L/t_bwd.log | head -40
tar czf $OUT/logs.tgz -C /tmp c5
python3 - $L <<'PY'
import csv, sys
L = sys.argv[1]
def rows(f):
    try: return {r['case']: r for r in csv.DictReader(open(f))}
    except Exception: return {}
tm = {}
try:
    tm = {r['case']: r for r in csv.DictReader(open(f"{L}/anchors_main.csv")) if r['impl'] == 'torch-flex' and r['Hq'] == '16' and r['Sq'] == '4096' and r['D'] == '128'}
except Exception: pass
f, p = rows(f"{L}/fused.csv"), rows(f"{L}/pass.csv")
print("case: fwd flexjit torch ratio | bwd fused pass torch ratio(fused) ratio(pass)")
for c in f:
    t = tm.get(c, {})
    ff, tf = float(f[c]['fwd_tflops']), float(t.get('fwd_tflops', 'nan'))
    bf, bp, tb = float(f[c]['bwd_tflops'] or 'nan'), float(p.get(c, {}).get('bwd_tflops') or 'nan'), float(t.get('bwd_tflops', 'nan'))
    print(f"{c:18} {ff:6.1f} {tf:6.1f} {ff/tf:5.2f} | {bf:6.1f} {bp:6.1f} {tb:6.1f} {bf/tb:5.2f} {bp/tb:5.2f}")
PY
el end
