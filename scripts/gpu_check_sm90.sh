#!/usr/bin/env bash
# The GPU check of the Hopper forward (forward/sm90a_wgmma) in one device call of under 10
# minutes: runs ON the GPU machine from the repository root with a Release build carried in
# .carry/build (flexjit, flexjit-tests) and the anchors in .carry/anchors. Logs under $OUT.
#   1. [gpu][forward][small] against both families (a hang here is a pipeline deadlock: the
#      step is time-limited);
#   2. compute-sanitizer memcheck, racecheck and synccheck on small shapes;
#   3. the whole [gpu] forward and buffer suites against both families;
#   4. a block_n / num_stages sweep on noop and causal, sm80_mma on three cases, and the
#      transcendental-heavy cases with approximate math;
#   5. scripts/gpu_check.sh's benchmark (main shape and extras) and the anchors (torch flex,
#      SDPA) in the same run, with its side-by-side table last.
# SKIP_ANCHORS=1 skips step 5's anchors (the table then uses the stored CSV, marked so);
# SKIP_SUITES=1 skips steps 1 and 3 (the whole [gpu] suite covers them: ~510 s on an H100).
set -u
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$(mktemp -d /tmp/gpu_sm90_out.XXXXXX)}"
export OUT
mkdir -p "$OUT"
B="${BUILD:-.carry/build}"
export FLEXJIT_CACHE_DIR="${FLEXJIT_CACHE_DIR:-/tmp/fjc}"
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s)
step() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
summary() { grep -E "FAILED|failed|test cases|assertions" -A4 "$1" | head -"${2:-40}"; }
bench() { timeout -k 3 "$1" "$B/flexjit" bench "${@:2}" 2>&1 | grep -v "^#" | grep -v "^case" ; }

if [ "${SKIP_SUITES:-0}" != 1 ]; then
  step small-tests
  timeout -k 3 100 "$B/flexjit-tests" "[gpu][forward][small]" > "$OUT/t_small.log" 2>&1
  echo "rc=$?"; summary "$OUT/t_small.log" 60
fi
for tool in memcheck racecheck synccheck; do
  step "$tool"
  timeout -k 3 60 compute-sanitizer --tool "$tool" "$B/flexjit" bench --small --repeats 1 \
    --case causal,alibi+causal,document+causal > "$OUT/san_$tool.log" 2>&1
  echo "rc=$?"; grep -E "SUMMARY|Error" "$OUT/san_$tool.log" | sort | uniq -c | head -5
done
if [ "${SKIP_SUITES:-0}" != 1 ]; then
  step forward-tests
  timeout -k 3 400 "$B/flexjit-tests" "[gpu][forward],[gpu][buffers]" > "$OUT/t_fwd.log" 2>&1
  echo "rc=$?"; summary "$OUT/t_fwd.log" 80
fi
step sweep
for cfg in "--block-n 176" "--block-n 128 --stages 2" "--block-n 128 --stages 4"; do
  echo "-- $cfg"; bench 40 --case noop,causal $cfg | head -2
done
echo "-- sm80_mma"
FLEXJIT_EXCLUDE_VARIANTS=forward/sm90a_wgmma bench 60 --case noop,causal,softcap30+causal | head -3
echo "-- approximate math"
FLEXJIT_MATH=approx bench 60 --case softcap30+causal,alibi+causal | head -2
step bench-and-anchors
SKIP_TESTS=1 SKIP_SANITIZERS=1 SKIP_MASKS=1 T_BENCH=150 T_ANCHORS=200 bash scripts/gpu_check.sh \
  > "$OUT/gpu_check.log" 2>&1
cat "$OUT/steps.txt" 2>/dev/null
sed -n '/== attention forward/,$p' "$OUT/gpu_check.log" | head -60
step done
