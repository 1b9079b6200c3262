#!/usr/bin/env bash
# The GPU check of chunked prefill on a KV cache and of the decode bandwidth (issue "Decoding"):
# runs ON the GPU machine, from the repository root, with a Release build carried in .carry/
# (.carry/build/flexjit, .carry/build/flexjit-tests). Writes logs under $OUT and prints a summary
# last (the device tool returns only the tail of the output). Fits one 10-minute device call with
# the default limits: the candidates stop when the whole run nears BUDGET seconds (default 560),
# so a slow run leaves its summary rather than being cut off. In two calls instead:
#   SKIP_CANDIDATES=1 bash scripts/gpu_check_paged.sh
#   SKIP_TESTS=1 SKIP_MEMCHECK=1 SKIP_BENCH=1 bash scripts/gpu_check_paged.sh
#
#   bash scripts/gpu_check_paged.sh
#   SKIP_CANDIDATES=1 bash scripts/gpu_check_paged.sh     # tests, memcheck, bench only
#   SKIP_TESTS=1 SKIP_MEMCHECK=1 bash scripts/gpu_check_paged.sh   # benchmarks only
#
# Steps:
#   1) tests      "[gpu][decode]": split-KV decoding and chunked prefill ([prefill]: the forward
#                 on paged / ragged caches against the fp64 reference)
#   2) memcheck   compute-sanitizer memcheck of "[gpu][prefill][small]" (tiny paged prefills at
#                 page sizes 1, 16, 128 and ragged) and of `flexjit run` on a small paged prefill
#   3) bench      `flexjit bench --decode`: the decode cases in TB/s against the copy bandwidth and
#                 the chunked-prefill group (contiguous vs ragged vs 16-key pages, TFLOP/s)
#   4) candidates the anchors' decode shape (group decode) under candidate decode configs
#                 (docs/kernels/decode.md, "Config and the split heuristic"), then the tuner's
#                 pick (--autotune search), to choose new defaults from measurements
# Switches (1 = on): SKIP_TESTS, SKIP_MEMCHECK, SKIP_BENCH, SKIP_CANDIDATES. Limits in seconds:
# T_TESTS, T_MEMCHECK, T_BENCH, T_CANDIDATE (each candidate), T_TUNE, BUDGET. Every step is
# time-limited and the script goes on after a failure (set -u, never set -e).
set -u

cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$(mktemp -d /tmp/gpu_check_paged.XXXXXX)}"
mkdir -p "$OUT"
BUILD="${BUILD:-.carry/build}"
FLEXJIT="$BUILD/flexjit"
TESTS="$BUILD/flexjit-tests"
SKIP_TESTS="${SKIP_TESTS:-0}"
SKIP_MEMCHECK="${SKIP_MEMCHECK:-0}"
SKIP_BENCH="${SKIP_BENCH:-0}"
SKIP_CANDIDATES="${SKIP_CANDIDATES:-0}"
T_TESTS="${T_TESTS:-200}"
T_MEMCHECK="${T_MEMCHECK:-90}"
T_BENCH="${T_BENCH:-80}"
T_CANDIDATE="${T_CANDIDATE:-20}"
T_TUNE="${T_TUNE:-90}"
BUDGET="${BUDGET:-560}"

export PATH="$PATH:/usr/local/cuda/bin"
if [ -d .carry/lib ]; then export LD_LIBRARY_PATH=".carry/lib:${LD_LIBRARY_PATH:-}"; fi
FLEXJIT_CACHE_DIR="$(mktemp -d /tmp/flexjit-cache.XXXXXX)"
export FLEXJIT_CACHE_DIR
SCRATCH="$(mktemp -d /tmp/flexjit-paged.XXXXXX)"
trap 'rm -rf "$FLEXJIT_CACHE_DIR" "$SCRATCH"' EXIT

STEPS="$OUT/steps.txt"
: > "$STEPS"
T0=$(date +%s)

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
  printf '%-22s rc=%-4s %4ss%s\n' "$name" "$rc" "$(($(date +%s) - start))" "$note" >> "$STEPS"
  return "$rc"
}
skip() { printf '%-22s skipped%s\n' "$1" "${2:+ ($2)}" >> "$STEPS"; }

echo "== nvidia-smi -L"
timeout 20 nvidia-smi -L 2>&1 | tee "$OUT/gpu.txt"
for f in "$FLEXJIT" "$TESTS"; do
  [ -x "$f" ] || echo "WARNING: $f is missing or not executable" | tee -a "$STEPS"
done

# 1) The decode and chunked-prefill GPU tests (-d yes: each case's time; the cases print their
#    errors against the fp64 reference).
if [ "$SKIP_TESTS" = 1 ]; then skip tests SKIP_TESTS; else
  step tests "$T_TESTS" "$TESTS" "[gpu][decode]" -d yes > "$OUT/tests.log" 2>&1
  summary=$(grep -E '^(All tests passed|test cases:)' "$OUT/tests.log" | tail -n 1)
  [ -z "$summary" ] && summary="no Catch2 summary; last line: $(tail -n 1 "$OUT/tests.log")"
  echo "tests: $summary" >> "$STEPS"
  grep -q 'skipped: no GPU' "$OUT/tests.log" && echo "tests: some report 'skipped: no GPU'" >> "$STEPS"
fi

# 2) compute-sanitizer memcheck: the small paged prefills, then `flexjit run` on a paged cache
#    with a prefill-length q (Sq = 40, 16-key pages, GQA 3) built here with numpy.
if [ "$SKIP_MEMCHECK" = 1 ]; then skip memcheck SKIP_MEMCHECK
elif ! command -v compute-sanitizer > /dev/null; then skip memcheck "no compute-sanitizer on PATH"
else
  {
    step memcheck-tests $((T_MEMCHECK * 2 / 3)) compute-sanitizer --tool memcheck \
      --report-api-errors no --error-exitcode 3 "$TESTS" "[gpu][prefill][small]"
    if python3 -c 'import numpy' 2> /dev/null; then
      python3 - "$SCRATCH" <<'PY'
import sys, numpy as np
d = sys.argv[1]
rng = np.random.default_rng()
B, Hkv, G, Sq, D, ps, max_pages = 2, 2, 3, 40, 64, 16, 6
pages = rng.permutation(B * max_pages + 2).astype(np.int32)
np.save(f"{d}/q.npy", rng.standard_normal((B, Hkv * G, Sq, D)).astype(np.float32))
pool = rng.standard_normal((B * max_pages + 2, ps, Hkv, D)).astype(np.float32)
np.save(f"{d}/k.npy", pool)
np.save(f"{d}/v.npy", rng.standard_normal(pool.shape).astype(np.float32))
np.save(f"{d}/table.npy", pages[: B * max_pages].reshape(B, max_pages))
np.save(f"{d}/lens.npy", np.array([90, 33], dtype=np.int32))
PY
      step memcheck-run $((T_MEMCHECK / 3)) compute-sanitizer --tool memcheck \
        --report-api-errors no --error-exitcode 3 "$FLEXJIT" run --mods causal \
        --q "$SCRATCH/q.npy" --k "$SCRATCH/k.npy" --v "$SCRATCH/v.npy" \
        --page-table "$SCRATCH/table.npy" --seq-lens "$SCRATCH/lens.npy" --check-pages --check \
        --repeat 1
    else
      skip memcheck-run "no numpy"
    fi
  } > "$OUT/memcheck.log" 2>&1
  echo "memcheck: $(grep -c 'ERROR SUMMARY: 0 errors' "$OUT/memcheck.log") clean runs; $(grep -E 'ERROR SUMMARY: [1-9]' "$OUT/memcheck.log" | head -2 | tr '\n' ' ')" >> "$STEPS"
fi

# 3) The decode cases and chunked prefill, with the plans logged (FLEXJIT_LOG=kernels).
if [ "$SKIP_BENCH" = 1 ]; then skip bench SKIP_BENCH; else
  FLEXJIT_LOG=kernels step bench "$T_BENCH" "$FLEXJIT" bench --decode --csv "$OUT/decode.csv" \
    > "$OUT/bench.log" 2> "$OUT/bench_plans.log"
fi

# 4) Decode config candidates on the anchors' decode shape (group "decode": noop, alibi, noop in
#    16-key pages). The defaults: 64-key tiles, 4 warps, 3 stages (100 KB: 2 CTAs per SM), splits
#    from the heuristic (4 on a 132-SM H100: 256 CTAs). The candidates probe the two levers the
#    heuristic fixes: more CTAs in flight (2 stages or 32-key tiles fit 3 CTAs per SM) and the
#    split count (the tail and the combine's share).
CANDIDATES=(
  "--splits 2"
  "--splits 6"
  "--splits 8"
  "--splits 16"
  "--stages 2"
  "--stages 2 --splits 6"
  "--stages 4"
  "--block-n 32 --warps 2 --stages 4"
  "--block-n 32 --warps 2 --stages 4 --splits 6"
  "--block-n 128 --warps 4 --stages 2"
  "--warps 2 --stages 3"
)
if [ "$SKIP_CANDIDATES" = 1 ]; then skip candidates SKIP_CANDIDATES; else
  : > "$OUT/candidates.log"
  for cand in "${CANDIDATES[@]}"; do
    if [ $(($(date +%s) - T0 + T_CANDIDATE + 20)) -gt "$BUDGET" ]; then
      skip "cand $cand" "BUDGET $BUDGET s"
      continue
    fi
    echo "### candidate: $cand" >> "$OUT/candidates.log"
    # shellcheck disable=SC2086
    step "cand $cand" "$T_CANDIDATE" "$FLEXJIT" bench --decode --case decode --use-cache $cand \
      >> "$OUT/candidates.log" 2>&1
  done
  left=$((BUDGET - 20 - ($(date +%s) - T0)))
  if [ "$left" -lt 30 ]; then skip tune-decode "BUDGET $BUDGET s"; else
    step tune-decode $((left < T_TUNE ? left : T_TUNE)) "$FLEXJIT" bench --decode --case decode \
      --autotune search > "$OUT/tune_decode.log" 2>&1
  fi
fi

echo
echo "== decode: K/V bandwidth (default config)"
grep -E 'device copy bandwidth|TB/s  =' "$OUT/bench.log" 2> /dev/null
echo
echo "== chunked prefill (B=4 Hq=32 Hkv=8 Sq=2048 Skv=8192 D=128, offset causal): TFLOP/s"
grep -E '^offset_causal' "$OUT/bench.log" 2> /dev/null
grep -E 'forward plan on the KV cache|decode plan on the KV cache' "$OUT/bench_plans.log" 2> /dev/null | sort | uniq -c | head -5
if [ -f "$OUT/candidates.log" ]; then
  echo
  echo "== decode candidates (anchors' decode shape; default first)"
  grep -E '^  decode ' "$OUT/bench.log" 2> /dev/null | sed 's/^/default   /'
  awk '/^### candidate:/ { c = substr($0, 16) } /TB\/s  =/ { printf "%-44s %s\n", c, $0 }' \
    "$OUT/candidates.log"
  echo "-- the tuner's pick (--autotune search):"
  grep -E 'tuned|->' "$OUT/tune_decode.log" 2> /dev/null | head -12
fi
echo
echo "== steps ($(($(date +%s) - T0)) s in all; logs in $OUT)"
cat "$STEPS"
