#!/usr/bin/env bash
# Session 4 call 4: persistent default at d 64 (st.async tile hand-off): [gpu][forward], sanitizers,
# d64 sweep, main, anchors (main + extra) in the same call.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c4; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee $L/gpu.txt
export FLEXJIT_CACHE_DIR=$(mktemp -d)
N=.carry/build/flexjit
for r in 1 2; do
  timeout -k 5 90 $N bench --only-extra --csv $L/extra_$r.csv > $L/extra_$r.log 2>&1; el "extra $r rc=$?"
done
timeout -k 5 60 $N bench --only-extra --case d64 --persistent 0 --csv $L/np_d64.csv > $L/np_d64.log 2>&1; el "np d64 rc=$?"
timeout -k 5 60 $N bench --only-extra --case d64 --stages 3 --csv $L/s3_d64.csv > $L/s3_d64.log 2>&1; el "s3 d64 rc=$?"
timeout -k 5 60 $N bench --only-extra --case d64 --block-n 192 --csv $L/bn192_d64.csv > $L/bn192_d64.log 2>&1; el "bn192 d64 rc=$?"
timeout -k 5 60 $N bench --only-extra --case d64 --block-m 192 --csv $L/bm192_d64.csv > $L/bm192_d64.log 2>&1; el "bm192 d64 rc=$?"
timeout -k 5 120 $N bench --case main --csv $L/main.csv > $L/main.log 2>&1; el "main rc=$?"
timeout -k 5 150 python3 .carry/anchors/torch_flex_bench.py --csv $L/anchors_main.csv > $L/anchors_main.log 2>&1; el "anchors main rc=$?"
timeout -k 5 150 python3 .carry/anchors/torch_flex_bench.py --only-extra --csv $L/anchors_extra.csv > $L/anchors_extra.log 2>&1; el "anchors extra rc=$?"
for p in 0 1; do for tool in memcheck racecheck synccheck; do
  timeout -k 3 90 compute-sanitizer --tool $tool --error-exitcode 3 $N bench --small --repeats 1 --no-flush --use-cache --persistent $p \
    --case noop,causal,alibi+causal,document+causal,relbias+causal > $L/san_${tool}_$p.log 2>&1
  el "$tool persistent=$p rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $L/san_${tool}_$p.log | sort | uniq -c | head -3
done; done
left=$(( 570 - ($(date +%s) - T0) ))
timeout -k 5 $left .carry/build/flexjit-tests "[gpu][forward]" > $L/t_fwd.log 2>&1
el "[gpu][forward] rc=$? (limit $left)"; tail -3 $L/t_fwd.log; grep -B3 -A12 FAILED $L/t_fwd.log | head -30
tar czf $OUT/logs.tgz -C /tmp c4
python3 - $L <<'PY'
import csv, sys, glob, math
L = sys.argv[1]
def rows(f, impl=None):
    try: return {f"{r['case']}@{r['Hkv']}/{r['Sq']}/{r['D']}": float(r['fwd_tflops']) for r in csv.DictReader(open(f)) if r.get('fwd_tflops') and (impl is None or r['impl'] == impl)}
    except Exception: return {}
tor = rows(f"{L}/anchors_extra.csv", 'torch-flex'); tor.update(rows(f"{L}/anchors_main.csv", 'torch-flex'))
for tag in ('extra_1', 'extra_2', 'np_d64', 's3_d64', 'bn192_d64', 'bm192_d64', 'main'):
    d = rows(f"{L}/{tag}.csv")
    out = []
    groups = {}
    for c, v in d.items():
        t = tor.get(c)
        out.append(f"{c}={v:.1f}" + (f"({v/t:.2f})" if t else ""))
        if t: groups.setdefault(c.split('@')[1], []).append(v / t)
    print(tag, " ".join(out))
    print("   geomeans:", {g: round(math.exp(sum(map(math.log, r)) / len(r)), 3) for g, r in groups.items()})
PY
el end
