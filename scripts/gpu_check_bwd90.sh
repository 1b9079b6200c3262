#!/usr/bin/env bash
# The GPU check of the Hopper backward (backward_dkdv/sm90a_wgmma, backward_dq/sm90a_wgmma, the
# sm_90a default since 2026-11-25), in two device calls of under 10 minutes each (PART=1, PART=2; unset: both,
# which may pass the 10-minute limit). Runs ON the GPU machine from the repository root with a
# Release build carried in .carry/build (flexjit, flexjit-tests). Logs under $OUT.
#   PART=1  1. which variants the backward selects with the sm_90a variants enabled
#              (FLEXJIT_LOG=kernels);
#           2. a small backward under compute-sanitizer memcheck, racecheck and synccheck (a
#              hang here is a pipeline deadlock: every step is time-limited);
#           3. the [gpu][backward] suite with the variants enabled: each case against both
#              families (test::backward_families: "sm90a_wgmma", then "sm80_mma").
#   PART=2  4. [gpu][forward][small] against both forward families (the forward's epilogue now
#              uses the helpers it shares with the backward);
#           5. `flexjit bench --backward --quick` (B=4 H=16 S=4096 D=128 bf16: noop, causal,
#              alibi+causal, document+causal), sm90a_wgmma then sm80_mma (RUNS=2: twice each,
#              for the spread), 3 stages and dQ's 128-key tiles on noop / causal, the extra
#              shapes' quick set (GQA, D=64, 16k) on sm90a_wgmma, and torch flex's stored H100
#              figures;
#           6. a short table last.
# SKIP_SUITE=1 skips step 3; SKIP_SANITIZERS=1 skips step 2. Preparing the carry (this machine):
#   ninja -C build flexjit flexjit-tests && mkdir -p .carry/build &&
#   cp build/flexjit build/flexjit-tests .carry/build/
# then, on the device: PART=1 bash scripts/gpu_check_bwd90.sh (carry: .carry), then PART=2.
# [gpu][backward] runs every case against both families itself (test::backward_families).
set -u
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$(mktemp -d /tmp/gpu_bwd90_out.XXXXXX)}"
export OUT
mkdir -p "$OUT"
B="${BUILD:-.carry/build}"
PART="${PART:-all}"
export FLEXJIT_CACHE_DIR="${FLEXJIT_CACHE_DIR:-/tmp/fjc}"
export PATH="$PATH:/usr/local/cuda/bin"
if [ -d .carry/lib ]; then export LD_LIBRARY_PATH=".carry/lib:${LD_LIBRARY_PATH:-}"; fi
SM90=backward_dkdv/sm90a_wgmma,backward_dq/sm90a_wgmma
t0=$(date +%s)
step() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
summary() { grep -E "FAILED|failed|test cases|assertions" -A4 "$1" | head -"${2:-40}"; }
# bench LIMIT EXCLUDE ARGS...: the backward benchmark with FLEXJIT_EXCLUDE_VARIANTS=EXCLUDE
# (empty: the sm90a_wgmma default; $SM90: the sm80_mma variants).
bench() {
  FLEXJIT_EXCLUDE_VARIANTS="$2" timeout -k 3 "$1" "$B/flexjit" bench --backward "${@:3}" 2>&1 |
    grep -v "^#"
}

if [ "$PART" != 2 ]; then
  step selection
  FLEXJIT_LOG=kernels timeout -k 3 45 "$B/flexjit" bench \
    --backward --small --repeats 1 --case causal > "$OUT/selection.log" 2>&1
  echo "rc=$?"; grep -E "backward_(dkdv|dq)" "$OUT/selection.log" | sort | uniq | head -6

  if [ "${SKIP_SANITIZERS:-0}" != 1 ]; then
    for tool in memcheck racecheck synccheck; do
      step "$tool"
      timeout -k 3 75 compute-sanitizer --tool "$tool" \
        "$B/flexjit" bench --backward --small --repeats 1 \
        --case causal,alibi+causal,document+causal > "$OUT/san_$tool.log" 2>&1
      echo "$tool rc=$?" | tee -a "$OUT/san_summary.txt"
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error" "$OUT/san_$tool.log" | sort | uniq -c |
        head -5 | tee -a "$OUT/san_summary.txt"
    done
  fi

  if [ "${SKIP_SUITE:-0}" != 1 ]; then
    step backward-tests
    timeout -k 3 280 "$B/flexjit-tests" "[gpu][backward]" \
      > "$OUT/t_bwd.log" 2>&1
    echo "rc=$?"; summary "$OUT/t_bwd.log" 80
    grep -E "\[sm90a_wgmma\]" "$OUT/t_bwd.log" | head -60 > "$OUT/t_bwd_sm90_lines.txt"
  fi
fi

if [ "$PART" != 1 ]; then
  step forward-small-tests
  timeout -k 3 100 "$B/flexjit-tests" "[gpu][forward][small]" > "$OUT/t_fwd_small.log" 2>&1
  echo "rc=$?"; summary "$OUT/t_fwd_small.log" 30
  step bench
  for run in $(seq 1 "${RUNS:-1}"); do
    echo "-- run $run: sm90a_wgmma (the default)"
    bench 90 "" --quick | tee "$OUT/bench_sm90_$run.txt"
    echo "-- run $run: sm80_mma (sm90a_wgmma excluded)"
    bench 90 "$SM90" --quick | tee "$OUT/bench_sm80_$run.txt"
  done
  # Configs (they apply to the forward too, where it takes them): dK/dV and dQ with 3 stages;
  # dQ with 128-key tiles.
  for cfg in "--stages 3" "--block-n 128"; do
    echo "-- sm90a_wgmma $cfg"; bench 60 "" --case noop,causal $cfg | tee -a "$OUT/bench_sweep.txt"
  done
  echo "-- extra shapes, sm90a_wgmma"
  bench 110 "" --quick --only-extra | tee "$OUT/bench_sm90_extra.txt"
  # Stored, not this run (docs/perf/NOTES.md v6; run the anchors in the same call for a ratio).
  echo "-- torch flex on an H100, 2026-11-23, stored (fwd / bwd TFLOP/s):"
  echo "   noop 475.9 / 383.3, causal 382.8 / 332.0, alibi+causal 350.4 / 323.3,"
  echo "   document+causal 302.0 / 242.8"
fi

step table
{
  echo "backward tests: $(grep -E "test cases" "$OUT/t_bwd.log" 2>/dev/null | tail -1)"
  echo "forward small tests: $(grep -E "test cases" "$OUT/t_fwd_small.log" 2>/dev/null | tail -1)"
  echo "sanitizers:"; cat "$OUT/san_summary.txt" 2>/dev/null
  for f in sm90_1 sm80_1 sm90_2 sm80_2; do
    [ -f "$OUT/bench_$f.txt" ] || continue
    echo "bwd $f:"; grep -E "^[a-z+0-9]+ +main|backward:" "$OUT/bench_$f.txt"
  done
  echo "targets: noop >= 300, causal >= 260 TFLOP/s (torch flex 383 / 332)"
} | tee "$OUT/table.txt"
step done
