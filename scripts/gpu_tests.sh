#!/usr/bin/env bash
# The [gpu] tests in groups, each under its own time limit: runs ON the GPU machine from the
# repository root with a Release build carried in .carry/build (flexjit-tests and flexjit beside
# it, for the CLI tests). The whole [gpu] suite takes 510-830 s on an H100 and longer on an H200,
# more than one 10-minute device call, so a call runs the groups it has time for:
#
#   bash scripts/gpu_tests.sh                                   # the default groups, in order
#   bash scripts/gpu_tests.sh '140:[gpu][decode]' '200:backward: GQA*'
#
# Each argument is LIMIT:SPEC (seconds, and a Catch2 test spec). A group is not started once the
# run has used BUDGET seconds (default 540), so the summary always comes back. One log per group
# and steps.txt go under $OUT/tests/; the summary (per group: rc, seconds, Catch2's last line)
# prints last. Never set -e: a failing group does not stop the others.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$(mktemp -d /tmp/gpu_tests_out.XXXXXX)}"
TESTS="${TESTS:-.carry/build/flexjit-tests}"
BUDGET="${BUDGET:-540}"
LOGS="$OUT/tests"
mkdir -p "$LOGS"
# A private kernel cache, removed at exit.
FLEXJIT_CACHE_DIR="$(mktemp -d /tmp/flexjit-cache.XXXXXX)"
export FLEXJIT_CACHE_DIR
trap 'rm -rf "$FLEXJIT_CACHE_DIR"' EXIT

if [ "$#" -eq 0 ]; then
  set -- '150:[gpu][decode]' '240:[gpu][backward]' '300:[gpu][forward]' \
    '120:[gpu]~[decode]~[backward]~[forward]'
fi
[ -x "$TESTS" ] || { echo "gpu_tests.sh: $TESTS is missing or not executable" >&2; exit 1; }
timeout 20 nvidia-smi -L 2>&1 | head -n 1

T0=$(date +%s)
STEPS="$LOGS/steps.txt"
: > "$STEPS"
i=0
for group in "$@"; do
  i=$((i + 1))
  limit="${group%%:*}"
  spec="${group#*:}"
  used=$(($(date +%s) - T0))
  if [ "$used" -ge "$BUDGET" ]; then
    printf '%-2s %-60s skipped (budget: %ss used of %ss)\n' "$i" "$spec" "$used" "$BUDGET" >> "$STEPS"
    continue
  fi
  # Never past the budget: the group's limit shrinks to what is left.
  left=$((BUDGET - used))
  [ "$limit" -gt "$left" ] && limit="$left"
  log="$LOGS/group$i.log"
  start=$(date +%s)
  echo "== group $i (limit ${limit}s): $spec" >&2
  timeout -k 10 "$limit" "$TESTS" "$spec" > "$log" 2>&1
  rc=$?
  note=""
  { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && note=" TIMED OUT"
  summary=$(grep -E '^(All tests passed|test cases:)' "$log" | tail -n 1)
  [ -z "$summary" ] && summary="no Catch2 summary; last line: $(tail -n 1 "$log" | cut -c1-120)"
  printf '%-2s %-60s rc=%-3s %4ss%s  %s\n' "$i" "$spec" "$rc" "$(($(date +%s) - start))" "$note" \
    "$summary" >> "$STEPS"
  grep -q 'skipped: no GPU' "$log" && echo "   group $i: some tests report 'skipped: no GPU'" >> "$STEPS"
  grep -E -B2 -A12 'FAILED' "$log" | head -n 40 >> "$LOGS/failures.txt"
done
echo "== [gpu] test groups ($TESTS)"
cat "$STEPS"
