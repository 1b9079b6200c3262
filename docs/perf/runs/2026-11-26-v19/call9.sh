#!/usr/bin/env bash
# Session 6 call 9 (final, 49f3e08): sanitizers, D=64 against base9 (the kernels of 4ec75b4),
# chunked_local / dilated_sliding defaults, bench extra / main beside torch flex (same call).
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c9; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
export FLEXJIT_CACHE_DIR=$(mktemp -d)
N=.carry/build/flexjit; B=.carry/base9/flexjit
for tool in racecheck memcheck synccheck; do
  timeout -k 3 60 compute-sanitizer --tool $tool --error-exitcode 3 $N bench --repeats 1 --no-flush --use-cache --shape 2,4,2,333,64 --case noop,causal,document+causal,sliding1024,softcap30+causal > $L/san_$tool.log 2>&1
  el "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $L/san_$tool.log | sort | uniq -c | head -2
done
for i in 1 2; do
  timeout -k 5 60 $N bench --only-extra --case d64 --csv $L/new_d64_$i.csv > /dev/null 2>&1; el "new d64 $i rc=$?"
  timeout -k 5 60 $B bench --only-extra --case d64 --csv $L/base_d64_$i.csv > /dev/null 2>&1; el "base d64 $i rc=$?"
done
for m in chunked_local dilated_sliding; do
  $N bench --shape 8,16,16,2048,64 --mods $m --csv $L/${m}_new.csv > /dev/null 2>&1
  $B bench --shape 8,16,16,2048,64 --mods $m --csv $L/${m}_base.csv > /dev/null 2>&1
done
el "mods"
timeout -k 5 90 $N bench --only-extra --csv $L/extra_1.csv > $L/extra_1.log 2>&1; el "extra rc=$?"
timeout -k 5 100 $N bench --case main --csv $L/main.csv > $L/main.log 2>&1; el "main rc=$?"
timeout -k 5 150 python3 .carry/anchors/torch_flex_bench.py --only-extra --csv $L/anchors_extra.csv > $L/anchors_extra.log 2>&1; el "anchors extra rc=$?"
left=$(( 590 - ($(date +%s) - T0) ))
timeout -k 5 $left python3 .carry/anchors/torch_flex_bench.py --csv $L/anchors_main.csv > $L/anchors_main.log 2>&1; el "anchors main rc=$? (limit $left)"
for f in $L/new_d64_*.csv $L/base_d64_*.csv $L/*_new.csv $L/*_base.csv; do echo "$(basename $f): $(grep -v '^impl' $f | cut -d, -f2,12 | tr '\n' ' ')"; done
python3 - $L <<'PY' | tee $L/summary.txt
import csv, sys, math
L = sys.argv[1]
def rows(f, impl=None):
    try: return {f"{r['case']}@{r['Hkv']}/{r['Sq']}/{r['D']}": float(r['fwd_tflops']) for r in csv.DictReader(open(f)) if r.get('fwd_tflops') and (impl is None or r['impl'] == impl)}
    except Exception: return {}
tor = rows(f"{L}/anchors_extra.csv", 'torch-flex'); tor.update(rows(f"{L}/anchors_main.csv", 'torch-flex'))
for tag in ('extra_1', 'new_d64_1', 'new_d64_2', 'base_d64_1', 'base_d64_2', 'main'):
    d = rows(f"{L}/{tag}.csv"); groups = {}; out = []
    for c, v in d.items():
        t = tor.get(c)
        out.append(f"{c}={v:.1f}/{t}" + (f"({v/t:.2f})" if t else ""))
        if t: groups.setdefault(c.split('@')[1], []).append(v / t)
    print(tag, " ".join(out))
    print("   geomeans:", {g: round(math.exp(sum(map(math.log, r)) / len(r)), 3) for g, r in groups.items()})
PY
tar czf $OUT/logs.tgz -C /tmp c9
el end
