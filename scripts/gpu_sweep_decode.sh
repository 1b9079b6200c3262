#!/usr/bin/env bash
# One device call that sweeps the decode kernel's variants and configs (issue "Decoding": the
# anchors' decode shape at >= 2.5 TB/s on an H100; docs/kernels/decode.md, "L2 hints").
#
#   bash scripts/gpu_sweep_decode.sh FLEXJIT_BINARY OUT_DIR
#   e.g. bash scripts/gpu_sweep_decode.sh .carry/build/flexjit "$OUT/sweep"
#
# Every run is `flexjit bench --decode` on the decode cases only (no chunked prefill): group
# decode (the anchors' shape B=8 Hq=32 Hkv=8 Sq=1 Skv=8192 D=128: noop, alibi+causal, noop in
# 16-key pages), and for the main runs decode_128k (B=1, 128k keys) and decode_spec4 (4 query
# tokens). One log per run in OUT_DIR (NN_name.log; the kernel selections in NN_name.plans.log),
# a table of every run's TB/s last. Runs go in order of importance and stop when the next would
# pass BUDGET seconds (default 110), so the whole script stays under 120 s on an H100.
#
# Variants (experimental, selected with FLEXJIT_ENABLE_VARIANTS; they rank above the defaults):
#   decode_split/sm80_ef       K/V cp.async with an L2::evict_first cache policy
#   decode_split/sm80_ef256    the same plus the L2::256B prefetch-size hint
#   decode_combine/warp_batched  the combine issuing 8 splits' loads before using them
# Configs: the bench's --stages / --block-n / --warps / --splits (docs/kernels/decode.md).
# Diagnostic: --no-flush (no 100 MiB memset before each repeat, so no dirty lines in the L2).
# Correctness of the variants first (optional, not in BUDGET): TESTS=path/to/flexjit-tests.
set -u

if [ $# -lt 2 ]; then
  echo "usage: $0 FLEXJIT_BINARY OUT_DIR" >&2
  exit 2
fi
FLEXJIT="$1"
OUT_DIR="$2"
BUDGET="${BUDGET:-110}"
T_RUN="${T_RUN:-40}"
mkdir -p "$OUT_DIR"
if [ ! -x "$FLEXJIT" ]; then
  echo "$FLEXJIT is missing or not executable" >&2
  exit 2
fi
if [ -z "${FLEXJIT_CACHE_DIR:-}" ]; then
  FLEXJIT_CACHE_DIR="$(mktemp -d /tmp/flexjit-sweep-cache.XXXXXX)"
  trap 'rm -rf "$FLEXJIT_CACHE_DIR"' EXIT
fi
export FLEXJIT_CACHE_DIR
T0=$(date +%s)
ALL="decode,decode_128k,decode_spec4"
EF="decode_split/sm80_ef"
EF256="decode_split/sm80_ef256"
CB="decode_combine/warp_batched"

# name | FLEXJIT_ENABLE_VARIANTS | cases | extra bench flags
RUNS=(
  "base||$ALL|"
  "ef|$EF|$ALL|"
  "ef_cb|$EF,$CB|$ALL|"
  "base_noflush||decode|--no-flush"
  "ef_noflush|$EF|decode|--no-flush"
  "cb|$CB|$ALL|"
  "ef_stages2_splits4|$EF|decode|--stages 2 --splits 4"
  "base_stages2_splits4||decode|--stages 2 --splits 4"
  "ef_bn32w2s2|$EF|decode|--block-n 32 --warps 2 --stages 2"
  "ef_bn32w2s2_splits4|$EF|decode|--block-n 32 --warps 2 --stages 2 --splits 4"
  "ef256_cb|$EF256,$CB|$ALL|"
  "ef_stages2|$EF|decode|--stages 2"
  "ef_bn32w2s4|$EF|decode|--block-n 32 --warps 2 --stages 4"
  "ef_splits8|$EF|decode|--splits 8"
  "base_again||decode|"
  "ef_again|$EF|decode|"
)

# Optional, before the timings and outside BUDGET: the decode GPU tests on the new variants
# (TESTS=.carry/build/flexjit-tests; each suite limited to T_TESTS seconds, default 200).
if [ -n "${TESTS:-}" ]; then
  for enable in "$EF,$CB" "$EF256"; do
    tag="tests_${enable//[\/,]/_}"
    FLEXJIT_ENABLE_VARIANTS="$enable" timeout -k 5 "${T_TESTS:-200}" "$TESTS" \
      "[gpu][decode]~[prefill]~[tune]" > "$OUT_DIR/$tag.log" 2>&1
    echo "$tag rc=$? $(grep -E '^(All tests passed|test cases:)' "$OUT_DIR/$tag.log" | tail -n 1)"
  done
  T0=$(date +%s)
fi

SUMMARY="$OUT_DIR/summary.txt"
: > "$SUMMARY"

# Quick correctness of every variant (counts in BUDGET, ~10 s): `flexjit run --check` (softcap: max
# relative error of out against the CPU backend's fp64 reference; bf16 passes under 2e-2) on
# small decode inputs written here with numpy: the anchors' structure (B=8 Hq=32 Hkv=8, 1000
# keys: 4 splits, the combine's one-pass path), GQA 3 at 3000 keys (23 splits: its multi-pass
# path), and 16-key pages (shuffled, ragged lengths 1000 / 777).
if python3 -c 'import numpy' 2> /dev/null; then
  DATA="$(mktemp -d /tmp/flexjit-sweep-data.XXXXXX)"
  python3 - "$DATA" <<'PY'
import sys, numpy as np
d = sys.argv[1]
rng = np.random.default_rng()
def save(name, a):  # bf16 bits in uint16 (round to nearest even), as --dtype bf16 reads them
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    np.save(f"{d}/{name}.npy", ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16))
save("q1", rng.standard_normal((8, 32, 1, 128))); save("k1", rng.standard_normal((8, 8, 1000, 128)))
save("v1", rng.standard_normal((8, 8, 1000, 128)))
save("q2", rng.standard_normal((1, 6, 1, 128))); save("k2", rng.standard_normal((1, 2, 3000, 128)))
save("v2", rng.standard_normal((1, 2, 3000, 128)))
B, Hkv, ps, max_pages = 2, 2, 16, 63
pages = rng.permutation(B * max_pages + 3).astype(np.int32)
save("q3", rng.standard_normal((B, Hkv * 4, 1, 128)))
save("k3", rng.standard_normal((B * max_pages + 3, ps, Hkv, 128)))
save("v3", rng.standard_normal((B * max_pages + 3, ps, Hkv, 128)))
np.save(f"{d}/t3.npy", pages[: B * max_pages].reshape(B, max_pages))
np.save(f"{d}/l3.npy", np.array([1000, 777], dtype=np.int32))
PY
  for enable in "" "$EF,$CB" "$EF256"; do
    for c in 1 2 3; do
      extra=""
      [ "$c" = 3 ] && extra="--page-table $DATA/t3.npy --seq-lens $DATA/l3.npy"
      log="$OUT_DIR/check_${c}_${enable//[\/,]/_}.log"
      # shellcheck disable=SC2086
      FLEXJIT_ENABLE_VARIANTS="$enable" FLEXJIT_LOG=kernels timeout -k 5 30 "$FLEXJIT" run \
        --mods softcap --dtype bf16 --q "$DATA/q$c.npy" --k "$DATA/k$c.npy" \
        --v "$DATA/v$c.npy" $extra --check --repeat 1 > "$log" 2>&1
      rc=$?
      rel=$(grep -oE 'max relative error vs the fp64 CPU reference: [0-9.e+-]+' "$log" | awk '{print $NF}')
      sel=$(grep -oE 'selected decode_(split|combine)/[a-z0-9_]+' "$log" | sort -u | awk '{print $2}' | tr '\n' ' ')
      verdict=$(awk -v r="${rel:-nan}" 'BEGIN { print (r != "nan" && r + 0 < 2e-2) ? "ok" : "FAIL" }')
      echo "check $c enable='$enable' rc=$rc rel=${rel:-none} $verdict [$sel]" >> "$SUMMARY"
    done
  done
  rm -rf "$DATA"
else
  echo "checks skipped: no numpy" >> "$SUMMARY"
fi
i=0
for run in "${RUNS[@]}"; do
  IFS='|' read -r name enable cases flags <<< "$run"
  i=$((i + 1))
  tag=$(printf '%02d_%s' "$i" "$name")
  elapsed=$(($(date +%s) - T0))
  if [ "$elapsed" -gt $((BUDGET - 8)) ]; then
    echo "$tag skipped (at ${elapsed}s, BUDGET ${BUDGET}s)" >> "$SUMMARY"
    continue
  fi
  limit=$((BUDGET - elapsed))
  [ "$limit" -gt "$T_RUN" ] && limit="$T_RUN"
  start=$(date +%s)
  # The selections are logged (FLEXJIT_LOG=kernels, one line per call) except with --no-flush,
  # where no memset hides the host's time per call and the logging would add to it.
  log=kernels
  case "$flags" in *--no-flush*) log="" ;; esac
  # shellcheck disable=SC2086
  FLEXJIT_ENABLE_VARIANTS="$enable" FLEXJIT_LOG="$log" timeout -k 5 "$limit" \
    "$FLEXJIT" bench --decode --use-cache --case "$cases" $flags \
    > "$OUT_DIR/$tag.log" 2> "$OUT_DIR/$tag.plans.log"
  rc=$?
  {
    echo "### $tag: enable='$enable' cases=$cases flags='$flags' rc=$rc $(($(date +%s) - start))s"
    grep -E 'TB/s  =' "$OUT_DIR/$tag.log" | sed 's/^/    /'
    grep -oE 'selected decode_(split|combine)/[a-z0-9_]+' "$OUT_DIR/$tag.plans.log" | sort | uniq -c |
      sed 's/^/    /'
    grep -E 'FAILED|non-finite|error' "$OUT_DIR/$tag.log" | head -3 | sed 's/^/    /'
  } >> "$SUMMARY"
done
grep -m1 -E 'device copy bandwidth' "$OUT_DIR"/01_base.log >> "$SUMMARY" 2> /dev/null
echo "total $(($(date +%s) - T0))s" >> "$SUMMARY"
# Compact table last: TB/s per case and run (the device tool keeps the output's tail).
{
  echo
  printf '%-24s %7s %7s %7s %7s %7s\n' run noop alibi paged16 128k spec4
  for f in "$OUT_DIR"/[0-9][0-9]_*.log; do
    case "$f" in *.plans.log) continue ;; esac
    awk -v run="$(basename "$f" .log)" '
      /TB\/s  =/ {
        key = $1 ":" $2; v = $(NF - 5)
        if ($1 == "decode" && $2 == "noop" && $3 == "paged16") { key = "paged"; v = $(NF - 5) }
        else if ($1 == "decode" && $2 == "noop") key = "noop"
        else if ($1 == "decode") key = "alibi"
        else if ($1 == "decode_128k") key = "128k"
        else if ($1 == "decode_spec4") key = "spec4"
        t[key] = v
      }
      END {
        printf "%-24s %7s %7s %7s %7s %7s\n", run, t["noop"] ? t["noop"] : "-",
          t["alibi"] ? t["alibi"] : "-", t["paged"] ? t["paged"] : "-",
          t["128k"] ? t["128k"] : "-", t["spec4"] ? t["spec4"] : "-"
      }' "$f"
  done
} >> "$SUMMARY"
cat "$SUMMARY"
