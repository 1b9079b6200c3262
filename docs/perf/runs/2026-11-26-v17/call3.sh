#!/usr/bin/env bash
# Session 4 call 3: persistent CTAs with the work counter (dynamic), d64 and main vs the default;
# GPU tests of the non-default configs (persistent included); sanitizers on small persistent runs;
# torch flex --only-extra in the same call.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c3; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee $L/gpu.txt
export FLEXJIT_CACHE_DIR=$(mktemp -d)
N=.carry/build/flexjit
for r in 1 2; do
  timeout -k 5 90 $N bench --only-extra --case d64 --csv $L/new_d64_$r.csv > $L/new_d64_$r.log 2>&1; el "new d64 $r rc=$?"
  timeout -k 5 90 $N bench --only-extra --case d64 --persistent 1 --csv $L/pers_d64_$r.csv > $L/pers_d64_$r.log 2>&1; el "pers d64 $r rc=$?"
done
for r in 1 2; do
  timeout -k 5 120 $N bench --case main --csv $L/new_main_$r.csv > $L/new_main_$r.log 2>&1; el "new main $r rc=$?"
  timeout -k 5 120 $N bench --case main --persistent 1 --csv $L/pers_main_$r.csv > $L/pers_main_$r.log 2>&1; el "pers main $r rc=$?"
done
timeout -k 5 60 $N bench --only-extra --case gqa,long --persistent 1 --csv $L/pers_gl.csv > $L/pers_gl.log 2>&1; el "pers gqa/long rc=$?"
timeout -k 5 60 $N bench --only-extra --case gqa,long --csv $L/new_gl.csv > $L/new_gl.log 2>&1; el "new gqa/long rc=$?"
for tool in memcheck racecheck synccheck; do
  timeout -k 3 90 compute-sanitizer --tool $tool --error-exitcode 3 $N bench --small --repeats 1 --no-flush --use-cache --persistent 1 \
    --case noop,causal,alibi+causal,document+causal,relbias+causal > $L/san_$tool.log 2>&1
  el "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error" $L/san_$tool.log | sort | uniq -c | head -4
done
timeout -k 5 150 python3 .carry/anchors/torch_flex_bench.py --only-extra --csv $L/anchors_extra.csv > $L/anchors_extra.log 2>&1; el "anchors extra rc=$?"
left=$(( 560 - ($(date +%s) - T0) ))
timeout -k 5 $left .carry/build/flexjit-tests "forward: sm90a_wgmma's non-default*" > $L/t_nondef.log 2>&1
el "tests rc=$? (limit $left)"; tail -3 $L/t_nondef.log; grep -B3 -A12 FAILED $L/t_nondef.log | head -30
tar czf $OUT/logs.tgz -C /tmp c3
python3 - $L <<'PY'
import csv, sys, glob
L = sys.argv[1]
def rows(f):
    try: return {f"{r['case']}@{r['Hkv']}/{r['Sq']}": float(r['fwd_tflops']) for r in csv.DictReader(open(f)) if r.get('fwd_tflops')}
    except Exception: return {}
for grp in ('d64', 'main', 'gl'):
    for tag in ('new', 'pers'):
        fs = sorted(glob.glob(f"{L}/{tag}_{grp}*.csv"))
        data = [rows(f) for f in fs]
        if not data or not data[0]: print(grp, tag, "no data"); continue
        print(grp, tag, " ".join(f"{c}={'/'.join(f'{d.get(c, 0):.1f}' for d in data)}" for c in data[0]))
try:
    for r in csv.DictReader(open(f"{L}/anchors_extra.csv")):
        if r['impl'] in ('torch-flex', 'sdpa-cudnn_attention'): print('anchor', r['impl'], r['case'], r['Hq'], r['Hkv'], r['Sq'], r['D'], r['fwd_tflops'])
except Exception as e: print(e)
PY
el end
