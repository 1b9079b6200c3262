#!/usr/bin/env bash
# CI's sanitizer and fuzzing job (scripts/test.sh calls it; docs/fuzzing.md explains the choices).
# One clang build with AddressSanitizer + UndefinedBehaviorSanitizer into build-san/ (the
# library also carries libFuzzer's coverage instrumentation, so the same build gives the fuzz
# target), then:
#   1) the GPU-free tests under the sanitizers, minus the NVRTC-bound ones (SAN_TESTS);
#   2) the .fx parser fuzz target for FUZZ_SECONDS on tests/fuzz/corpus plus every .fx file of
#      the repository.
# Any sanitizer report, failed test or fuzz crash fails the script. Knobs (environment):
#   SAN_TESTS     Catch2 test spec of the sanitized run (default below)
#   FUZZ_SECONDS  fuzzing time (default 120); 0 skips fuzzing
#   SKIP_SAN_TESTS=1 / SKIP_FUZZ=1
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
# NVRTC-bound cases (templates x mods x archs through NVRTC, nvcc comparisons) spend their time in
# NVIDIA's compilers, which are not instrumented: most of the suite's time, for nothing that the
# sanitizers can see. They run in the plain build (scripts/test.sh).
SAN_TESTS="${SAN_TESTS:-~[gpu]~[nvrtc]~[template]~[perf]~[.]~*nvcc}"
FUZZ_SECONDS="${FUZZ_SECONDS:-120}"
B=build-san

now() { date +%s; }
t0=$(now)
echo "== sanitizer build (clang, ASan + UBSan, -O1) into $B"
CC=clang CXX=clang++ cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -gline-tables-only" -DFLEXJIT_SANITIZE=ON -DFLEXJIT_FUZZ=ON \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed > /dev/null
ninja -C "$B" flexjit-tests flexjit-cli flexjit-fuzz-parser
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

if [ "${SKIP_FUZZ:-0}" != 1 ] && [ "$FUZZ_SECONDS" -gt 0 ]; then
  t2=$(now)
  work="$B/fuzz-corpus" seeds="$B/fuzz-seeds-fx" artifacts="$B/fuzz-artifacts"
  rm -rf "$work" "$seeds" "$artifacts"
  mkdir -p "$work" "$seeds" "$artifacts"
  # Every .fx file of the repository, as seeds (names made unique by their path).
  git ls-files -z '*.fx' | while IFS= read -r -d '' f; do cp "$f" "$seeds/${f//\//_}"; done
  echo "== fuzzing the .fx parser for ${FUZZ_SECONDS} s ($(find tests/fuzz/corpus -type f | wc -l) corpus" \
    "inputs, $(find "$seeds" -type f | wc -l) .fx files)"
  # New inputs go to the first directory (build-san/, not the repository).
  if ! "$B/flexjit-fuzz-parser" -max_total_time="$FUZZ_SECONDS" -dict=tests/fuzz/fx.dict \
      -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$artifacts/" "$work" tests/fuzz/corpus "$seeds" 2> "$B/fuzz.log"; then
    tail -n 60 "$B/fuzz.log"
    echo "FUZZ CRASH: reproduce with $B/flexjit-fuzz-parser $artifacts/<file>; copy the file into"
    echo "tests/fuzz/corpus/ (test_fuzz_corpus.cpp then replays it) and fix the bug."
    ls -l "$artifacts"
    exit 1
  fi
  grep -E '^(#[0-9]+.*DONE|stat::)' "$B/fuzz.log" || tail -n 5 "$B/fuzz.log"
  echo "== fuzzing: $(($(now) - t2)) s"
fi
echo "== sanitize.sh: $(($(now) - t0)) s in all"
