#!/usr/bin/env bash
# Session 4 call 1: base (ba6c21b) vs build (turns with immediate ids, Q descriptors rebuilt for
# mask mods, epilogue rows recomputed) on main and d64; block_m 192 with turns (noop d64);
# ncu launch facts of cuDNN's and our D=64 forward.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c1; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee $L/gpu.txt
export FLEXJIT_CACHE_DIR=$(mktemp -d)
B=.carry/base/flexjit; N=.carry/build/flexjit
for r in 1 2; do
  timeout -k 5 120 $B bench --case main --csv $L/base_main_$r.csv > $L/base_main_$r.log 2>&1; el "base main $r rc=$?"
  timeout -k 5 120 $N bench --case main --csv $L/new_main_$r.csv > $L/new_main_$r.log 2>&1; el "new main $r rc=$?"
done
for r in 1 2 3; do
  timeout -k 5 90 $B bench --case d64 --csv $L/base_d64_$r.csv > $L/base_d64_$r.log 2>&1; el "base d64 $r rc=$?"
  timeout -k 5 90 $N bench --case d64 --csv $L/new_d64_$r.csv > $L/new_d64_$r.log 2>&1; el "new d64 $r rc=$?"
  timeout -k 5 90 $N bench --case d64 --block-m 192 --csv $L/new192_d64_$r.csv > $L/new192_d64_$r.log 2>&1; el "new 192 d64 $r rc=$?"
done
SEC="--section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis --section SchedulerStats"
timeout -k 5 150 ncu $SEC -k regex:'sdpa|fprop|fmha|cudnn|flash|sm90' -c 4 python3 .carry/cudnn_d64.py > $L/ncu_cudnn.log 2>&1; el "ncu cudnn rc=$?"
timeout -k 5 120 ncu $SEC -k regex:flexjit_forward -s 3 -c 1 $N bench --case d64 --repeats 1 --no-flush --use-cache > $L/ncu_ours.log 2>&1; el "ncu ours rc=$?"
tar czf $OUT/logs.tgz -C /tmp c1
python3 - $L <<'PY'
import csv, sys, glob, statistics
L = sys.argv[1]
def rows(f):
    try: return {r['case']: float(r['fwd_tflops']) for r in csv.DictReader(open(f)) if r.get('fwd_tflops')}
    except Exception as e: return {}
for grp in ('main', 'd64'):
    for tag in ('base', 'new', 'new192'):
        fs = sorted(glob.glob(f"{L}/{tag}_{grp}_*.csv"))
        if not fs: continue
        data = [rows(f) for f in fs]
        cases = list(data[0].keys())
        print(grp, tag, " ".join(f"{c}={'/'.join(f'{d.get(c, 0):.1f}' for d in data)}" for c in cases))
PY
grep -E "^\s+[a-z_]*(sdpa|fprop|fmha|cudnn|flexjit)|Block Size|Grid Size|Registers Per|Shared Memory Configuration Size|Dynamic Shared|Static Shared|Theoretical Occupancy|Achieved Occupancy|Duration|Executed Ipc A|Issue Slots Busy|No Eligible|Compute \(SM\) Throughput|Waves Per SM|Executed Instructions  " $L/ncu_cudnn.log $L/ncu_ours.log | cut -c1-160
el end
