#!/usr/bin/env bash
# The one-call GPU check: runs ON the GPU machine, from the repository root, with a Release build
# carried in .carry/ (.carry/build/flexjit, .carry/build/flexjit-tests) and the anchor benchmark
# in .carry/anchors/torch_flex_bench.py. Writes logs and CSVs under $OUT and prints the
# side-by-side table last (the device tool returns only the tail of the output).
#
#   bash scripts/gpu_check.sh                  # everything: can pass 10 minutes, see below
#   QUICK=1 bash scripts/gpu_check.sh          # main shape quick subset, no extras
#   SKIP_ANCHORS=1 SKIP_MEMCHECK=1 bash scripts/gpu_check.sh
#
# Within a 10-minute device call, run it in two parts:
#   SKIP_BENCH=1 SKIP_ANCHORS=1 SKIP_MASKS=1 bash scripts/gpu_check.sh   # tests, compute-sanitizer
#   SKIP_TESTS=1 SKIP_SANITIZERS=1 bash scripts/gpu_check.sh             # bench, anchors, masks
#
# Switches (1 = on): QUICK, EXTRA (default 1 unless QUICK), SKIP_TESTS, SKIP_MEMCHECK,
# SKIP_RACECHECK, SKIP_SYNCCHECK, SKIP_SANITIZERS (all three compute-sanitizer tools),
# SKIP_BENCH, SKIP_ANCHORS, SKIP_MASKS. BENCH_ARGS adds arguments to `flexjit bench`.
# Time limits in seconds: T_TESTS (the [gpu] suite, TEST_SPEC to narrow it, in parallel shards
# through scripts/gpu_suite.sh; JOBS shards, default 16), T_MEMCHECK, T_RACECHECK, T_SYNCCHECK,
# T_BENCH, T_ANCHORS, T_MASK_FLEXJIT, T_MASK_TORCH.
# Every step is time-limited and the script goes on after a failure (set -u, never set -e).
set -u

cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$(mktemp -d /tmp/gpu_check_out.XXXXXX)}"
mkdir -p "$OUT"
BUILD="${BUILD:-.carry/build}"
FLEXJIT="$BUILD/flexjit"
TESTS="$BUILD/flexjit-tests"
ANCHORS="${ANCHORS:-.carry/anchors/torch_flex_bench.py}"
QUICK="${QUICK:-0}"
if [ "$QUICK" = 1 ]; then EXTRA="${EXTRA:-0}"; else EXTRA="${EXTRA:-1}"; fi
SKIP_TESTS="${SKIP_TESTS:-0}"
SKIP_SANITIZERS="${SKIP_SANITIZERS:-0}"
SKIP_MEMCHECK="${SKIP_MEMCHECK:-$SKIP_SANITIZERS}"
SKIP_RACECHECK="${SKIP_RACECHECK:-$SKIP_SANITIZERS}"
SKIP_SYNCCHECK="${SKIP_SYNCCHECK:-$SKIP_SANITIZERS}"
SKIP_BENCH="${SKIP_BENCH:-0}"
SKIP_ANCHORS="${SKIP_ANCHORS:-0}"
SKIP_MASKS="${SKIP_MASKS:-0}"
BENCH_ARGS="${BENCH_ARGS:-}"
T_TESTS="${T_TESTS:-420}"
T_MEMCHECK="${T_MEMCHECK:-90}"
T_RACECHECK="${T_RACECHECK:-150}"
T_SYNCCHECK="${T_SYNCCHECK:-90}"
T_BENCH="${T_BENCH:-120}"
T_ANCHORS="${T_ANCHORS:-150}"
T_MASK_FLEXJIT="${T_MASK_FLEXJIT:-30}"
T_MASK_TORCH="${T_MASK_TORCH:-60}"

export PYTHONUNBUFFERED=1
export PATH="$PATH:/usr/local/cuda/bin"
# Shared libraries carried with the build, if the lead put any there.
if [ -d .carry/lib ]; then export LD_LIBRARY_PATH=".carry/lib:${LD_LIBRARY_PATH:-}"; fi
# A private kernel cache, outside $OUT (which comes back to the caller) and removed at exit.
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
  printf '%-16s rc=%-4s %4ss%s\n' "$name" "$rc" "$(($(date +%s) - start))" "$note" >> "$STEPS"
  return "$rc"
}
skip() { printf '%-16s skipped%s\n' "$1" "${2:+ ($2)}" >> "$STEPS"; }

# 1) The GPU.
echo "== nvidia-smi -L"
timeout 20 nvidia-smi -L 2>&1 | tee "$OUT/gpu.txt"
timeout 20 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv >> "$OUT/gpu.txt" 2>&1

for f in "$FLEXJIT" "$TESTS"; do
  [ -x "$f" ] || echo "WARNING: $f is missing or not executable" | tee -a "$STEPS"
done

# 2) The GPU tests.
if [ "$SKIP_TESTS" = 1 ]; then skip tests SKIP_TESTS; else
  step tests "$T_TESTS" bash scripts/gpu_suite.sh -j "${JOBS:-16}" --log-dir "$OUT/suite" \
    "$TESTS" "${TEST_SPEC:-[gpu]}" > "$OUT/tests.log" 2>&1
  grep -E '^gpu_suite: wall|FAILED' "$OUT/tests.log" >> "$STEPS"
  cat "$OUT"/suite/shard*.log > "$OUT/suite/all.log" 2>/dev/null
  grep -q 'skipped: no GPU' "$OUT/suite/all.log" 2>/dev/null && echo "tests: some report 'skipped: no GPU'" >> "$STEPS"
fi

# 3) compute-sanitizer memcheck on small shapes: the [gpu][small] tests, then every benchmark
#    case at tiny shapes (flex_attention and create_block_mask with every standard mod).
if [ "$SKIP_MEMCHECK" = 1 ]; then skip memcheck SKIP_MEMCHECK
elif ! command -v compute-sanitizer > /dev/null; then skip memcheck "no compute-sanitizer on PATH"
else
  {
    step memcheck-tests $((T_MEMCHECK / 3)) compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
      "$TESTS" "[gpu][small]"
    step memcheck-bench $((T_MEMCHECK * 2 / 3)) compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
      "$FLEXJIT" bench --small --repeats 1 --no-flush --use-cache
  } > "$OUT/memcheck.log" 2>&1
  echo "memcheck: $(grep -c 'ERROR SUMMARY: 0 errors' "$OUT/memcheck.log") clean runs; $(grep -E 'ERROR SUMMARY: [1-9]' "$OUT/memcheck.log" | head -2 | tr '\n' ' ')" >> "$STEPS"
fi

# 3b) compute-sanitizer racecheck (shared-memory hazards) and synccheck (barrier misuse) on the
#     same small-shape tests. racecheck prints "RACECHECK SUMMARY: N hazards displayed (E errors,
#     W warnings)"; any error exits 3.
# sanitizer_step NAME TOOL LIMIT: runs the [gpu][small] tests under `compute-sanitizer --tool TOOL`.
sanitizer_step() {
  local name="$1" tool="$2" limit="$3"
  if ! command -v compute-sanitizer > /dev/null; then skip "$name" "no compute-sanitizer on PATH"; return; fi
  step "$name" "$limit" compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 3 \
    "$TESTS" "[gpu][small]" > "$OUT/$name.log" 2>&1
  echo "$name: $(grep -E '(ERROR|RACECHECK) SUMMARY' "$OUT/$name.log" | tail -n 1)" >> "$STEPS"
}
if [ "$SKIP_RACECHECK" = 1 ]; then skip racecheck SKIP_RACECHECK; else
  sanitizer_step racecheck racecheck "$T_RACECHECK"
fi
if [ "$SKIP_SYNCCHECK" = 1 ]; then skip synccheck SKIP_SYNCCHECK; else
  sanitizer_step synccheck synccheck "$T_SYNCCHECK"
fi

# 4) flexjit bench, 5) the anchors right after, on the same GPU.
BENCH_FLAGS=""
[ "$QUICK" = 1 ] && BENCH_FLAGS="--quick"
[ "$EXTRA" = 1 ] && BENCH_FLAGS="$BENCH_FLAGS --extra"
if [ "$SKIP_BENCH" = 1 ]; then skip bench SKIP_BENCH; else
  # shellcheck disable=SC2086
  step bench "$T_BENCH" "$FLEXJIT" bench $BENCH_FLAGS --csv "$OUT/flexjit.csv" $BENCH_ARGS \
    > "$OUT/bench.log" 2>&1
  tail -n 3 "$OUT/bench.log" | sed 's/^/bench: /' >> "$STEPS"
fi
ANCHOR_FLAGS=""
[ "$QUICK" = 1 ] && ANCHOR_FLAGS="--quick"
if [ "$SKIP_ANCHORS" = 1 ]; then skip anchors SKIP_ANCHORS
elif [ ! -f "$ANCHORS" ]; then skip anchors "no $ANCHORS"
else
  # shellcheck disable=SC2086
  step anchors "$T_ANCHORS" python3 "$ANCHORS" $ANCHOR_FLAGS --csv "$OUT/anchors.csv" \
    > "$OUT/anchors.log" 2>&1
fi

# 6) create_block_mask: flexjit vs torch.
if [ "$SKIP_MASKS" = 1 ]; then skip masks SKIP_MASKS; else
  step mask-flexjit "$T_MASK_FLEXJIT" "$FLEXJIT" mask bench > "$OUT/mask_flexjit.csv" 2> "$OUT/mask_flexjit.err"
  if [ "$SKIP_ANCHORS" != 1 ] && [ -f "$ANCHORS" ]; then
    step mask-torch "$T_MASK_TORCH" python3 "$ANCHORS" --block-mask > "$OUT/mask_torch.csv" 2> "$OUT/mask_torch.err"
  fi
fi

# 7) The side-by-side tables, printed last.
timeout 30 python3 - "$OUT" "$ANCHORS" <<'PY'
import csv, os, re, sys
out, anchors_py = sys.argv[1], sys.argv[2]
KEY = ("case", "B", "Hq", "Hkv", "Sq", "Skv", "D")

def rows_of(path):
    """CSV rows from a file, tolerating '#' comments, log noise and a truncated tail."""
    if not os.path.exists(path):
        return []
    lines = [l for l in open(path, errors="replace").read().splitlines() if l and not l.startswith("#")]
    header = None
    rows = []
    for l in lines:
        cells = l.split(",")
        if header is None:
            if "impl" in cells or "mask" in cells or "case" in cells:
                header = [c.strip() for c in cells]
            continue
        if len(cells) == len(header) and cells != header:
            rows.append(dict(zip(header, (c.strip() for c in cells))))
    return rows

def fnum(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None

flex = rows_of(os.path.join(out, "flexjit.csv")) or rows_of(os.path.join(out, "bench.log"))
anch = rows_of(os.path.join(out, "anchors.csv")) or rows_of(os.path.join(out, "anchors.log"))
source = "this run"
if not anch:
    stored = os.path.join(os.path.dirname(anchors_py), "h100_torch2.11.csv")
    anch = rows_of(stored)
    source = f"STORED {os.path.basename(stored)} (not this run)" if anch else "none"
by = {}
for r in anch:
    by[(r.get("impl"),) + tuple(r.get(k) for k in KEY)] = r

print()
print(f"== attention forward, TFLOP/s (flexjit vs anchors from {source})")
hdr = (f"{'case':<17} {'shape':<24} {'dens':>6} {'flexjit':>8} {'torch':>8} {'ratio':>6} {'FA2':>7} "
       f"{'cuDNN':>7} {'fj ms':>8} {'tf ms':>8} {'fj 1st s':>8} {'tf 1st s':>8}")
print(hdr)
def cell(v, w, p=1):
    return f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"
ratios = {}
for r in flex:
    k = tuple(r.get(x) for x in KEY)
    t = by.get(("torch-flex",) + k, {})
    fa = by.get(("sdpa-flash_attention",) + k, {})
    cu = by.get(("sdpa-cudnn_attention",) + k, {})
    f, tt = fnum(r.get("fwd_tflops")), fnum(t.get("fwd_tflops"))
    ratio = f / tt if f and tt else None
    shape = f"{r['B']}x{r['Hq']}/{r['Hkv']}x{r['Sq']}x{r['Skv']}x{r['D']}"
    if ratio is not None:
        ratios.setdefault(shape, []).append(ratio)
    print(f"{r['case']:<17} {shape:<24} {cell(fnum(r.get('density')), 6, 3)} {cell(f, 8)} {cell(tt, 8)} "
          f"{cell(ratio, 6, 2)} {cell(fnum(fa.get('fwd_tflops')), 7)} {cell(fnum(cu.get('fwd_tflops')), 7)} "
          f"{cell(fnum(r.get('fwd_ms')), 8, 3)} {cell(fnum(t.get('fwd_ms')), 8, 3)} "
          f"{cell(fnum(r.get('first_call_s')), 8, 2)} {cell(fnum(t.get('first_call_s')), 8, 2)}"
          + ("" if f is not None else "   FAILED (see bench.log)"))
if not flex:
    print("  (no flexjit rows: see bench.log)")
for shape, rs in ratios.items():
    g = 1.0
    for x in rs:
        g *= x
    print(f"  geomean ratio flexjit/torch-flex at {shape}: {g ** (1 / len(rs)):.2f} over {len(rs)} cases")

# create_block_mask: flexjit's `mask bench` CSV has some mask / S / ms columns; match loosely.
def norm(s):
    return re.sub(r"[^a-z0-9]", "", (s or "").lower())
fm = rows_of(os.path.join(out, "mask_flexjit.csv"))
tm = rows_of(os.path.join(out, "mask_torch.csv"))
if fm or tm:
    print()
    print("== create_block_mask, median ms (B=H=1, block 128)")
    torch_by = {}
    for r in tm:
        mode = "compiled" if "compiled" in r.get("impl", "") else "eager"
        torch_by[(norm(r.get("mask")), r.get("S"), mode)] = fnum(r.get("ms"))
    def col(r, *names):
        for n in names:
            for c in r:
                if c.lower() == n:
                    return r[c]
        return None
    print(f"{'mask':<20} {'S':>6} {'flexjit':>9} {'torch':>9} {'compiled':>9}")
    seen = set()
    for r in fm:
        m = col(r, "mask", "case", "mods", "name")
        s = col(r, "s", "seqlen", "seqlen_q", "sq")
        ms = fnum(col(r, "ms", "median_ms", "time_ms", "gpu_ms"))
        key = (norm(m), s)
        seen.add(key)
        print(f"{(m or '?'):<20} {(s or '?'):>6} {cell(ms, 9, 3)} {cell(torch_by.get(key + ('eager',)), 9, 3)} "
              f"{cell(torch_by.get(key + ('compiled',)), 9, 3)}")
    for (m, s, mode), v in sorted(torch_by.items(), key=lambda kv: (kv[0][0], int(kv[0][1] or 0))):
        if (m, s) not in seen and mode == "eager":
            print(f"{m:<20} {s:>6} {'-':>9} {cell(v, 9, 3)} {cell(torch_by.get((m, s, 'compiled')), 9, 3)}")
PY

echo
echo "== steps ($(($(date +%s) - T0)) s in all; logs in $OUT)"
cat "$STEPS"
grep -E '^targets' "$OUT/bench.log" 2> /dev/null
