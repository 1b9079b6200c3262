#!/usr/bin/env bash
# The GPU check of the deterministic buffer-gradient mode (issue 9; docs/backward.md,
# "Deterministic buffer gradients"): runs ON the GPU machine, from the repository root, with a
# Release build carried in .carry/ (.carry/build/flexjit, .carry/build/flexjit-tests), as
# scripts/gpu_check.sh. Writes logs under $OUT and prints a summary last.
#
#   bash scripts/gpu_check_determ.sh                        # everything: about 10-15 minutes
#
# Within 10-minute device calls, in two parts (the kernel cache is private to each call):
#   SKIP_TESTS_BWD=1 SKIP_BENCH=1 bash scripts/gpu_check_determ.sh   # [determ] tests, sanitizers
#   SKIP_TESTS_DETERM=1 SKIP_SANITIZERS=1 bash scripts/gpu_check_determ.sh  # backward tests, bench
#
# Steps (each time-limited; the script goes on after a failure):
#   1) the [gpu] tests of the backward: the deterministic ones ([determ]: bitwise the same over
#      3 runs, and the fp64 rule, for ALiBi, the relative-bias table and a 2-D bias, GQA 1 and
#      4), then the rest of [gpu][backward] and the CLI backward (atomic mode unchanged);
#   2) compute-sanitizer memcheck and racecheck on the small deterministic backward
#      ("[gpu][determ][small]": alibi, relative bias, 2-D bias);
#   3) flexjit bench --backward for alibi+causal and relbias+causal, fp32 atomics vs
#      deterministic, on the anchors' main shape (CSV per mode), and the cost table.
# Switches (1 = on): SKIP_TESTS (both test steps), SKIP_TESTS_DETERM, SKIP_TESTS_BWD,
# SKIP_MEMCHECK, SKIP_RACECHECK, SKIP_SANITIZERS (both), SKIP_BENCH.
# Limits in seconds: T_TESTS_DETERM, T_TESTS_BWD, T_MEMCHECK, T_RACECHECK, T_BENCH (each mode).
# BENCH_ARGS adds arguments to both benches (e.g. "--extra" for the GQA and D=64 shapes).
set -u

cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$(mktemp -d /tmp/gpu_check_determ_out.XXXXXX)}"
mkdir -p "$OUT"
BUILD="${BUILD:-.carry/build}"
FLEXJIT="$BUILD/flexjit"
TESTS="$BUILD/flexjit-tests"
SKIP_TESTS="${SKIP_TESTS:-0}"
SKIP_TESTS_DETERM="${SKIP_TESTS_DETERM:-$SKIP_TESTS}"
SKIP_TESTS_BWD="${SKIP_TESTS_BWD:-$SKIP_TESTS}"
SKIP_SANITIZERS="${SKIP_SANITIZERS:-0}"
SKIP_MEMCHECK="${SKIP_MEMCHECK:-$SKIP_SANITIZERS}"
SKIP_RACECHECK="${SKIP_RACECHECK:-$SKIP_SANITIZERS}"
SKIP_BENCH="${SKIP_BENCH:-0}"
BENCH_ARGS="${BENCH_ARGS:-}"
T_TESTS_DETERM="${T_TESTS_DETERM:-300}"
T_TESTS_BWD="${T_TESTS_BWD:-360}"
T_MEMCHECK="${T_MEMCHECK:-120}"
T_RACECHECK="${T_RACECHECK:-150}"
T_BENCH="${T_BENCH:-90}"

export PATH="$PATH:/usr/local/cuda/bin"
if [ -d .carry/lib ]; then export LD_LIBRARY_PATH=".carry/lib:${LD_LIBRARY_PATH:-}"; fi
# A private kernel cache, outside $OUT, removed at exit.
FLEXJIT_CACHE_DIR="$(mktemp -d /tmp/flexjit-cache.XXXXXX)"
export FLEXJIT_CACHE_DIR
trap 'rm -rf "$FLEXJIT_CACHE_DIR"' EXIT

STEPS="$OUT/steps.txt"
: > "$STEPS"
T0=$(date +%s)

# step NAME LIMIT CMD...: runs CMD under `timeout`, records rc and seconds in steps.txt.
step() {
  local name="$1" limit="$2"
  shift 2
  local start rc
  start=$(date +%s)
  echo "== $name (limit ${limit}s): $*" >&2
  timeout -k 10 "$limit" "$@"
  rc=$?
  local note=""
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && note=" (TIMED OUT)"
  printf '%-18s rc=%-4s %4ss%s\n' "$name" "$rc" "$(($(date +%s) - start))" "$note" >> "$STEPS"
  return "$rc"
}
skip() { printf '%-18s skipped%s\n' "$1" "${2:+ ($2)}" >> "$STEPS"; }
catch2_summary() {
  local s
  s=$(grep -E '^(All tests passed|test cases:)' "$1" | tail -n 1)
  [ -z "$s" ] && s="no Catch2 summary; last line: $(tail -n 1 "$1")"
  grep -q 'skipped: no GPU' "$1" && s="$s (some report 'skipped: no GPU')"
  echo "$s"
}

echo "== nvidia-smi -L"
timeout 20 nvidia-smi -L 2>&1 | tee "$OUT/gpu.txt"
for f in "$FLEXJIT" "$TESTS"; do
  [ -x "$f" ] || echo "WARNING: $f is missing or not executable" | tee -a "$STEPS"
done

# 1) The tests: the deterministic ones first (their per-case lines, with -s for the printed
#    errors), then every other backward test (the atomic mode and dq modes unchanged).
if [ "$SKIP_TESTS_DETERM" = 1 ]; then skip tests-determ SKIP_TESTS_DETERM; else
  step tests-determ "$T_TESTS_DETERM" "$TESTS" "[gpu][determ]" > "$OUT/tests_determ.log" 2>&1
  echo "tests-determ: $(catch2_summary "$OUT/tests_determ.log")" >> "$STEPS"
  grep -E '^  .*deterministic x' "$OUT/tests_determ.log" | cut -c1-160 > "$OUT/determ_cases.txt"
fi
if [ "$SKIP_TESTS_BWD" = 1 ]; then skip tests-backward SKIP_TESTS_BWD; else
  step tests-backward "$T_TESTS_BWD" "$TESTS" "[gpu][backward]~[determ],[gpu][cli][backward]" \
    > "$OUT/tests_backward.log" 2>&1
  echo "tests-backward: $(catch2_summary "$OUT/tests_backward.log")" >> "$STEPS"
fi

# 2) compute-sanitizer on the small deterministic backward: memcheck (out-of-bounds partial
#    slices, the reduction's reads) and racecheck (shared memory of the dK/dV kernel and the
#    reduction's warp sums).
sanitizer_step() {
  local name="$1" tool="$2" limit="$3"
  if ! command -v compute-sanitizer > /dev/null; then skip "$name" "no compute-sanitizer on PATH"; return; fi
  step "$name" "$limit" compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 3 \
    "$TESTS" "[gpu][determ][small]" > "$OUT/$name.log" 2>&1
  echo "$name: $(grep -E '(ERROR|RACECHECK) SUMMARY' "$OUT/$name.log" | tail -n 1)" >> "$STEPS"
}
if [ "$SKIP_MEMCHECK" = 1 ]; then skip memcheck SKIP_MEMCHECK; else
  sanitizer_step memcheck memcheck "$T_MEMCHECK"
fi
if [ "$SKIP_RACECHECK" = 1 ]; then skip racecheck SKIP_RACECHECK; else
  sanitizer_step racecheck racecheck "$T_RACECHECK"
fi

# 3) The cost: flexjit bench --backward on alibi+causal and relbias+causal, atomics vs
#    deterministic (the same cases, one after the other).
if [ "$SKIP_BENCH" = 1 ]; then skip bench SKIP_BENCH; else
  # shellcheck disable=SC2086
  step bench-atomic "$T_BENCH" "$FLEXJIT" bench --backward --case alibi+causal,relbias+causal \
    --csv "$OUT/bench_atomic.csv" $BENCH_ARGS > "$OUT/bench_atomic.log" 2>&1
  # shellcheck disable=SC2086
  step bench-determ "$T_BENCH" "$FLEXJIT" bench --backward --deterministic \
    --case alibi+causal,relbias+causal --csv "$OUT/bench_determ.csv" $BENCH_ARGS \
    > "$OUT/bench_determ.log" 2>&1
fi

# The cost table: backward ms and TFLOP/s per case, atomic vs deterministic.
timeout 30 python3 - "$OUT" << 'PY'
import csv, os, sys
out = sys.argv[1]
def rows(name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return {}
    lines = [l for l in open(path, errors="replace") if l.strip() and not l.startswith("#")]
    r = {}
    for row in csv.DictReader(lines):
        key = (row.get("case"), row.get("B"), row.get("Hq"), row.get("Hkv"), row.get("Sq"),
               row.get("D"))
        r[key] = row
    return r
a, d = rows("bench_atomic.csv"), rows("bench_determ.csv")
def f(row, k):
    try:
        return float(row.get(k, ""))
    except (TypeError, ValueError):
        return None
print()
print("== backward, fp32 atomics vs deterministic buffer gradients")
print(f"{'case':<16} {'shape':<22} {'atomic ms':>10} {'determ ms':>10} {'cost':>7} "
      f"{'atomic TF/s':>11} {'determ TF/s':>11}")
for key in sorted(set(a) | set(d), key=str):
    ra, rd = a.get(key, {}), d.get(key, {})
    ma, md = f(ra, "bwd_ms"), f(rd, "bwd_ms")
    cost = f"{md / ma:.2f}x" if ma and md else "-"
    shape = "x".join(x or "?" for x in key[1:])
    cell = lambda v, p: f"{v:.{p}f}" if v is not None else "-"
    print(f"{key[0] or '?':<16} {shape:<22} {cell(ma, 3):>10} {cell(md, 3):>10} {cost:>7} "
          f"{cell(f(ra, 'bwd_tflops'), 1):>11} {cell(f(rd, 'bwd_tflops'), 1):>11}")
if not a and not d:
    print("  (no rows: see bench_atomic.log / bench_determ.log)")
PY

echo
echo "== steps ($(($(date +%s) - T0)) s in all; logs in $OUT)"
cat "$STEPS"
