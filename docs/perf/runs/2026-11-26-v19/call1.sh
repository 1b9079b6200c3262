#!/usr/bin/env bash
# Session 6 call 1: where the D=64 calls' time goes (kernel durations and gaps), flexjit and torch.
set -u
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s); L=/tmp/c1; mkdir -p $L
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export FLEXJIT_CACHE_DIR=$(mktemp -d)
N=.carry/build/flexjit
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
el "nsys=$NSYS"; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
$N bench --only-extra --case d64 --csv $L/warm.csv > $L/warm.log 2>&1; el "warm rc=$?"
if [ -n "$NSYS" ]; then
  timeout -k 5 120 $NSYS profile -t cuda -o $L/fj --force-overwrite true $N bench --only-extra --case d64 --use-cache --csv $L/fj.csv > $L/nsys_fj.log 2>&1; el "nsys fj rc=$?"
  $NSYS stats --report cuda_gpu_trace --format csv -o $L/fj $L/fj.nsys-rep > /dev/null 2>&1; el "stats rc=$?"
  timeout -k 5 300 $NSYS profile -t cuda -o $L/torch --force-overwrite true python3 .carry/anchors/torch_flex_bench.py --only-extra --csv $L/torch.csv > $L/nsys_torch.log 2>&1; el "nsys torch rc=$?"
  $NSYS stats --report cuda_gpu_trace --format csv -o $L/torch $L/torch.nsys-rep > /dev/null 2>&1; el "stats rc=$?"
else
  timeout -k 5 200 ncu --metrics gpu__time_duration.sum --csv $N bench --only-extra --case d64 --use-cache --repeats 3 > $L/ncu.csv 2>&1; el "ncu rc=$?"
fi
ls -la $L; rm -f $L/*.sqlite $L/*.nsys-rep
gzip $L/*trace*.csv 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp c1
