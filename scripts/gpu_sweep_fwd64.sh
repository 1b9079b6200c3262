#!/usr/bin/env bash
# Issue 10's head-dim-64 sweep of forward/sm90a_wgmma in one device call (< 150 s on an H100):
# the 4 D=64 bench cases (B=8 H=16 S=2048 D=64 bf16: noop, causal, alibi+causal,
# document+causal) under each candidate config, then the main shape's noop / causal
# (B=4 H=16 S=4096 D=128) once with the defaults for reference. Runs from the repository root.
#   bash scripts/gpu_sweep_fwd64.sh FLEXJIT_BINARY OUT_DIR [BASELINE_FLEXJIT_BINARY]
# The optional third argument (e.g. main's build) runs the defaults of that binary first, so
# the table compares both builds in one call. One log per candidate under OUT_DIR, a summary
# table (TFLOP/s) last on stdout and in OUT_DIR/summary.txt.
# Candidates (docs/kernels/forward_sm90.md "Configs"): block_m 192 = three consumer
# warpgroups (the masked cases need a block mask of 192-row q blocks, which the bench does not
# build: those rows report the refusal and only noop runs); block_n 176 / 192; 2 / 3 stages.
set -u
BIN="${1:?usage: $0 FLEXJIT_BINARY OUT_DIR [BASELINE_BINARY]}"
OUT="${2:?usage: $0 FLEXJIT_BINARY OUT_DIR [BASELINE_BINARY]}"
BASE="${3:-}"
mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s)
# bench NAME BINARY TIMEOUT ARGS...: one run, its CSV and log under OUT.
bench() {
  local name="$1" bin="$2" limit="$3"
  shift 3
  echo "== $name ($(($(date +%s) - t0)) s): $*"
  timeout -k 3 "$limit" "$bin" bench "$@" --csv "$OUT/$name.csv" > "$OUT/$name.log" 2>&1
  echo "rc=$?" >> "$OUT/$name.log"
  grep -v "^#" "$OUT/$name.log" | grep -v "^case" | cut -c1-150
}
D64=(--only-extra --case d64)
if [ -n "$BASE" ]; then
  bench base_default "$BASE" 40 "${D64[@]}"
fi
bench default "$BIN" 40 "${D64[@]}"
bench bm192 "$BIN" 30 "${D64[@]}" --block-m 192
bench bm192_s2 "$BIN" 30 --only-extra --case d64:noop --block-m 192 --stages 2
bench bm192_bn64 "$BIN" 30 --only-extra --case d64:noop --block-m 192 --block-n 64
bench bn192 "$BIN" 30 --only-extra --case d64:noop --block-n 192
bench bn176 "$BIN" 30 --only-extra --case d64:noop --block-n 176
bench s3 "$BIN" 30 "${D64[@]}" --stages 3
bench main_default "$BIN" 40 --case main:noop,main:causal
if [ -n "$BASE" ]; then
  bench base_main_default "$BASE" 40 --case main:noop,main:causal
fi
# The summary: one row per case (D qualifies the shape), one column of TFLOP/s per run; "-":
# refused or failed (the run's log says why), blank: not in that run.
python3 - "$OUT" "$(($(date +%s) - t0))" <<'PY' | tee "$OUT/summary.txt"
import csv, glob, os, sys
out, secs = sys.argv[1], sys.argv[2]
runs, table, cases = [], {}, []
for f in sorted(glob.glob(os.path.join(out, "*.csv")), key=os.path.getmtime):
    run = os.path.basename(f)[:-4]
    runs.append(run)
    for r in csv.DictReader(open(f)):
        case = f"D{r['D']} {r['case']}"
        if case not in cases:
            cases.append(case)
        table[(case, run)] = r["fwd_tflops"] or "-"
print(f"# TFLOP/s ({secs} s in all)")
print(f"{'case':<22}" + "".join(f"{r[:14]:>15}" for r in runs))
for c in cases:
    print(f"{c:<22}" + "".join(f"{table.get((c, r), ''):>15}" for r in runs))
PY
