#!/usr/bin/env bash
# The first GPU check of the experimental Hopper forward (forward/sm90a_wgmma), in one device
# call of under 10 minutes: runs ON the GPU machine from the repository root with a Release
# build carried in .carry/build (flexjit, flexjit-tests). Logs under $OUT.
#   1. [gpu][forward][small] against both families (a hang here is a pipeline deadlock: the
#      step is time-limited);
#   2. flexjit bench on the main shape with sm90a_wgmma, and sm80_mma on three cases for the
#      same-run comparison, then a block_n / num_stages sweep on noop and causal;
#   3. the whole [gpu] forward and buffer suites against both families;
#   4. compute-sanitizer memcheck, racecheck and synccheck on small shapes.
# The anchors (torch flex) come from scripts/gpu_check.sh in the same call or the next.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$(mktemp -d /tmp/gpu_sm90_out.XXXXXX)}"
mkdir -p "$OUT"
B="${BUILD:-.carry/build}"
export FLEXJIT_CACHE_DIR="${FLEXJIT_CACHE_DIR:-/tmp/fjc}"
export FLEXJIT_ENABLE_VARIANTS=forward/sm90a_wgmma
t0=$(date +%s)
step() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
summary() { grep -E "FAILED|failed|test cases|assertions" -A4 "$1" | head -"${2:-40}"; }

step small-tests
timeout -k 3 100 "$B/flexjit-tests" "[gpu][forward][small]" > "$OUT/t_small.log" 2>&1
echo "rc=$?"; summary "$OUT/t_small.log" 60
step bench-sm90
timeout -k 3 90 "$B/flexjit" bench --csv "$OUT/sm90.csv" > "$OUT/bench_sm90.log" 2>&1
echo "rc=$?"; grep -v "^#" "$OUT/bench_sm90.log" | head -20
step bench-sm80
FLEXJIT_EXCLUDE_VARIANTS=forward/sm90a_wgmma timeout -k 3 60 "$B/flexjit" bench \
  --case noop,causal,softcap30+causal --csv "$OUT/sm80.csv" > "$OUT/bench_sm80.log" 2>&1
echo "rc=$?"; grep -v "^#" "$OUT/bench_sm80.log" | head -12
step sweep
for cfg in "--block-n 176 --stages 2" "--block-n 128 --stages 3" "--block-n 64 --stages 4"; do
  echo "-- $cfg"
  timeout -k 3 40 "$B/flexjit" bench --case noop,causal $cfg 2>&1 | grep -v "^#" | tail -4
done
step forward-tests
timeout -k 3 220 "$B/flexjit-tests" "[gpu][forward],[gpu][buffers]" > "$OUT/t_fwd.log" 2>&1
echo "rc=$?"; summary "$OUT/t_fwd.log" 80
for tool in memcheck racecheck synccheck; do
  step "$tool"
  timeout -k 3 60 compute-sanitizer --tool "$tool" "$B/flexjit" bench --small --repeats 1 \
    --case causal,alibi+causal,document+causal > "$OUT/san_$tool.log" 2>&1
  echo "rc=$?"; tail -4 "$OUT/san_$tool.log"
done
step fastmath
unset FLEXJIT_ENABLE_VARIANTS
timeout -k 3 90 "$B/flexjit-tests" "[gpu][fastmath]" > "$OUT/t_fastmath.log" 2>&1
echo "rc=$?"; summary "$OUT/t_fastmath.log" 30
for m in exact approx; do
  echo "-- math $m"
  FLEXJIT_MATH=$m timeout -k 3 40 "$B/flexjit" bench --case softcap30,softcap30+causal,alibi+causal 2>&1 | grep -v "^#" | tail -4
done
step done
