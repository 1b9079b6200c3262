#!/usr/bin/env bash
# CI's sanitizer and fuzzing job (scripts/test.sh calls it; docs/fuzzing.md explains the choices).
# One clang build with AddressSanitizer + UndefinedBehaviorSanitizer into build-san/ (the
# library also carries libFuzzer's coverage instrumentation, so the same build gives the fuzz
# target), then:
#   1) the GPU-free tests under the sanitizers, minus the NVRTC-bound ones (SAN_TESTS);
#   2) the .fx parser fuzz target for FUZZ_SECONDS on tests/fuzz/corpus plus every .fx file of
#      the repository;
#   3) the .npy reader and the tuning-manifest parser fuzz targets for FUZZ_INPUT_SECONDS each on
#      tests/fuzz/npy_corpus and tests/fuzz/manifest_corpus (plus examples/tune/*.json).
# Any sanitizer report, failed test or fuzz crash fails the script. Knobs (environment):
#   SAN_TESTS     Catch2 test spec of the sanitized run (default below)
#   FUZZ_SECONDS  the .fx parser's fuzzing time (default 120); 0 skips it
#   FUZZ_INPUT_SECONDS  the .npy and manifest targets' time each (default 30); 0 skips them
#   SKIP_SAN_TESTS=1 / SKIP_FUZZ=1
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
# NVRTC-bound cases (templates x mods x archs through NVRTC, nvcc comparisons) spend their time in
# NVIDIA's compilers, which are not instrumented: most of the suite's time, for nothing that the
# sanitizers can see. They run in the plain build (scripts/test.sh).
SAN_TESTS="${SAN_TESTS:-~[gpu]~[nvrtc]~[template]~[perf]~[.]~*nvcc}"
FUZZ_SECONDS="${FUZZ_SECONDS:-120}"
FUZZ_INPUT_SECONDS="${FUZZ_INPUT_SECONDS:-30}"
B=build-san

now() { date +%s; }
t0=$(now)
echo "== sanitizer build (clang, ASan + UBSan, -O1) into $B"
CC=clang CXX=clang++ cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -gline-tables-only" -DFLEXJIT_SANITIZE=ON -DFLEXJIT_FUZZ=ON \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed > /dev/null
ninja -C "$B" flexjit-tests flexjit-cli flexjit-fuzz-parser flexjit-fuzz-npy flexjit-fuzz-manifest
echo "== sanitizer build: $(($(now) - t0)) s"

# Reports abort the process (exit code != 0), with a stack trace. Leak checking stays on.
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

if [ "${SKIP_SAN_TESTS:-0}" != 1 ]; then
  t1=$(now)
  echo "== sanitized tests: $SAN_TESTS"
  cache="$(mktemp -d)"
  FLEXJIT_CACHE_DIR="$cache" "$B/flexjit-tests" --order rand "$SAN_TESTS"
  rm -rf "$cache"
  echo "== sanitized tests: $(($(now) - t1)) s"
fi

# fuzz NAME SECONDS CORPUS [libFuzzer options...]: runs build-san/flexjit-fuzz-NAME for SECONDS on
# CORPUS plus build-san/fuzz-seeds-NAME (filled by the caller); new inputs go to
# build-san/fuzz-corpus-NAME, never into the repository. A crash fails the script.
fuzz() {
  local name="$1" seconds="$2" corpus="$3"
  shift 3
  local work="$B/fuzz-corpus-$name" seeds="$B/fuzz-seeds-$name" artifacts="$B/fuzz-artifacts-$name"
  local t=$(now)
  rm -rf "$work" "$artifacts"
  mkdir -p "$work" "$seeds" "$artifacts"
  echo "== fuzzing the $name reader for ${seconds} s ($(find "$corpus" -type f | wc -l) corpus" \
    "inputs, $(find "$seeds" -type f | wc -l) seeds)"
  if ! "$B/flexjit-fuzz-$name" -max_total_time="$seconds" "$@" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$artifacts/" "$work" "$corpus" "$seeds" \
      2> "$B/fuzz-$name.log"; then
    tail -n 60 "$B/fuzz-$name.log"
    echo "FUZZ CRASH: reproduce with $B/flexjit-fuzz-$name $artifacts/<file>; copy the file into"
    echo "$corpus/ (test_fuzz_corpus.cpp then replays it) and fix the bug."
    ls -l "$artifacts"
    exit 1
  fi
  grep -E '^(#[0-9]+.*DONE|stat::)' "$B/fuzz-$name.log" || tail -n 5 "$B/fuzz-$name.log"
  echo "== fuzzing $name: $(($(now) - t)) s"
}

if [ "${SKIP_FUZZ:-0}" != 1 ] && [ "$FUZZ_SECONDS" -gt 0 ]; then
  # The .fx parser, seeded with every .fx file of the repository (names made unique by path).
  rm -rf "$B/fuzz-seeds-parser" && mkdir -p "$B/fuzz-seeds-parser"
  git ls-files -z '*.fx' | while IFS= read -r -d '' f; do cp "$f" "$B/fuzz-seeds-parser/${f//\//_}"; done
  fuzz parser "$FUZZ_SECONDS" tests/fuzz/corpus -dict=tests/fuzz/fx.dict -max_len=4096
fi
if [ "${SKIP_FUZZ:-0}" != 1 ] && [ "$FUZZ_INPUT_SECONDS" -gt 0 ]; then
  # The .npy reader and the tuning-manifest parser, seeded with their corpora (and the example
  # manifests).
  rm -rf "$B/fuzz-seeds-npy" "$B/fuzz-seeds-manifest" && mkdir -p "$B/fuzz-seeds-manifest"
  cp examples/tune/*.json "$B/fuzz-seeds-manifest/"
  fuzz npy "$FUZZ_INPUT_SECONDS" tests/fuzz/npy_corpus -max_len=1024
  fuzz manifest "$FUZZ_INPUT_SECONDS" tests/fuzz/manifest_corpus -max_len=8192
fi
echo "== sanitize.sh: $(($(now) - t0)) s in all"
