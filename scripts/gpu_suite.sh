#!/usr/bin/env bash
# Runs the [gpu] test suite as parallel shards on one GPU, so the whole suite fits one device call.
#
#   scripts/gpu_suite.sh [-j SHARDS] [--weights FILE] [--log-dir DIR] TESTS [CATCH2 SPEC]
#       TESTS: the flexjit-tests binary. SPEC: the cases to run (default "[gpu]").
#       -j SHARDS (default: the CPU count, at most 16): processes run at once. The suite's wall
#       time is NVRTC compiles (one core each) much more than GPU work, so the shards share the
#       GPU and one kernel cache (FLEXJIT_CACHE_DIR, a fresh one unless set; the disk cache is
#       safe between processes, docs/caching.md).
#       --weights FILE: "seconds<TAB>test name" lines (a previous run's durations.tsv): the
#       longest cases are dealt first, each to the least loaded shard (a case it lacks counts as
#       the median). Default: tests/gpu/durations.tsv (an H100 run), if present; --weights none
#       deals the cases round-robin in the suite's order.
#       --log-dir DIR (default: a temporary folder): shard logs and durations.tsv, every case's
#       wall time, longest first.
# Exit status: 0 when every shard passed, else 1 (the failing shards' logs are printed).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
jobs=$(nproc); [ "$jobs" -gt 16 ] && jobs=16
weights=""; logdir=""
while [ $# -gt 0 ]; do
  case "$1" in
    -j) jobs="$2"; shift 2 ;;
    --weights) weights="$2"; shift 2 ;;
    --log-dir) logdir="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "gpu_suite.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ -z "$weights" ] && [ -f "$here/../tests/gpu/durations.tsv" ]; then
  weights="$here/../tests/gpu/durations.tsv"
fi
[ "$weights" = none ] && weights=""
tests="${1:?usage: scripts/gpu_suite.sh [-j SHARDS] [--weights FILE] [--log-dir DIR] TESTS [SPEC]}"
spec="${2:-[gpu]}"
[ -x "$tests" ] || { echo "gpu_suite.sh: $tests is not an executable" >&2; exit 2; }
[ -n "$logdir" ] || logdir=$(mktemp -d)
mkdir -p "$logdir"
export FLEXJIT_CACHE_DIR="${FLEXJIT_CACHE_DIR:-$(mktemp -d)}"

# Deal the cases to shards. Catch2 reads the input file's lines as test specs, so a name's commas,
# brackets, quotes, wildcards and backslashes are escaped with a backslash.
# (Catch2 2 exits with the number of cases listed.)
"$tests" "$spec" --list-test-names-only > "$logdir/cases.raw" || true
sed '/^$/d' "$logdir/cases.raw" > "$logdir/cases.txt"
python3 - "$logdir" "$jobs" "$weights" <<'PY'
import sys
logdir, jobs, weights = sys.argv[1], int(sys.argv[2]), sys.argv[3]
names = [line.rstrip("\n") for line in open(f"{logdir}/cases.txt") if line.strip()]
known = {}
if weights:
    for line in open(weights):
        secs, _, name = line.rstrip("\n").partition("\t")
        known[name] = known.get(name, 0.0) + float(secs)  # a GENERATE'd case: one line per run
shards = [[] for _ in range(jobs)]
if known:
    default = sorted(known.values())[len(known) // 2] if known else 1.0
    load = [0.0] * jobs
    for name in sorted(names, key=lambda n: -known.get(n, default)):
        i = load.index(min(load))
        shards[i].append(name)
        load[i] += known.get(name, default)
else:
    for i, name in enumerate(names):
        shards[i % jobs].append(name)
for i, shard in enumerate(shards):
    with open(f"{logdir}/shard{i}.txt", "w") as f:
        for name in shard:
            f.write("".join("\\" + c if c in '\\,[]"*~' else c for c in name) + "\n")
PY
count=$(wc -l < "$logdir/cases.txt")
echo "gpu_suite: $count cases in $jobs shards, logs in $logdir"

start=$(date +%s)
pids=()
for ((i = 0; i < jobs; i++)); do
  [ -s "$logdir/shard$i.txt" ] || continue
  "$tests" --input-file "$logdir/shard$i.txt" --durations yes > "$logdir/shard$i.log" 2>&1 &
  pids+=("$i:$!")
done
failed=()
for entry in "${pids[@]}"; do
  i=${entry%%:*}; pid=${entry#*:}
  wait "$pid" || failed+=("$i")
done
end=$(date +%s)

# Catch2's --durations lines: "12.345 s: test name".
grep -h -E '^[0-9]+\.[0-9]+ s: ' "$logdir"/shard*.log | sed -E 's/^([0-9.]+) s: /\1\t/' \
  | sort -t$'\t' -k1,1 -g -r > "$logdir/durations.tsv" || true
echo "gpu_suite: wall $((end - start)) s; longest cases:"
head -n 8 "$logdir/durations.tsv" | sed 's/^/  /'
for i in "${failed[@]}"; do
  echo "== shard $i FAILED ($logdir/shard$i.log):"
  grep -v -E '^[0-9]+\.[0-9]+ s: ' "$logdir/shard$i.log" | tail -n 60
done
grep -h -E '^(All tests passed|test cases:)' "$logdir"/shard*.log | sed 's/^/  /'
[ ${#failed[@]} -eq 0 ]
