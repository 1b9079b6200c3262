#!/usr/bin/env bash
# SASS fingerprints of a kernel family's kernels, to prove a template change SASS-neutral
# without a GPU (docs/kernels/forward_sm90.md "Code structure").
#
#   scripts/sass_fingerprint.sh [-j JOBS] [--family FAMILY] [--configs FILE] FLEXJIT OUT.tsv
#       Compiles every configuration through `FLEXJIT inspect` (NVRTC, a fresh cache) and writes
#       one line per configuration: name, spec, registers (the launch bound), spill stores,
#       spill loads, stack frame, SASS instructions, a hash of the SASS (addresses stripped,
#       encodings kept), a hash of its instruction text, and every kernel of the cubin's
#       registers / stack / local bytes (cuobjdump -res-usage: the backward's and the
#       decode's modules hold more than one); the SASS goes to OUT.sass.d/.
#   scripts/sass_fingerprint.sh --compare BEFORE.tsv AFTER.tsv
#       Compares two such runs configuration by configuration: resources, and whether the SASS
#       is identical, identical but for register numbers (and reuse flags), the same
#       instructions reordered, or different (how many instructions, registers erased). Exits 1
#       if any configuration's registers, spills or stack changed (of any kernel in the cubin).
#
# Typical use: build the binary before the change, copy it aside (the templates are embedded in
# it), build after, run both and compare:
#   cp build/flexjit /tmp/flexjit.before   # (at the old commit)
#   scripts/sass_fingerprint.sh /tmp/flexjit.before /tmp/before.tsv
#   scripts/sass_fingerprint.sh build/flexjit /tmp/after.tsv
#   scripts/sass_fingerprint.sh --compare /tmp/before.tsv /tmp/after.tsv
# --family picks the default configurations (lines "name|inspect arguments", # comments; a
# --configs FILE of such lines replaces them and takes the family's leading arguments):
#   forward_sm90 (the default): forward/sm90a_wgmma on sm_90a, those the unit tests compile
#     (tests/unit/test_forward_sm90.cpp) plus the bench's and the sinks': every standard mod,
#     head dims 40..256 and q != v, 128- and 192-row tiles, q_tiles 2, persistent CTAs,
#     bf16 / f16, GQA, divisible lengths, diagonal loads; on a KV cache (16-key pages, bf16;
#     e4m3 caches: --kv-e4m3) and e4m3 q, k, v.
#   backward_sm90: backward_dkdv and backward_dq /sm90a_wgmma on sm_90a
#     (tests/unit/test_backward_sm90.cpp, test_backward_kernels.cpp): every standard mod at
#     d 128, f16 d 64, q != v, d 40-96, GQA, block_m 128 (dQ in the second pass, dq_atomic 0),
#     3 stages, the diagonal loads and gradient sites.
#   backward_sm80: backward_dkdv and backward_dq /sm80_mma on sm_80 and sm_90a: every standard
#     mod at d 128, d 64 / 256, q != v, f16 and f32 (tf32), GQA, deterministic buffer gradients
#     (with the reduction kernel), sinks (the sink-gradient kernel), divisible lengths.
#   decode: decode_split /sm80_mma (and the sm80_ef / sm80_ef256 L2-hint variants) on sm_80 and
#     sm_90a (tests/unit/test_decode.cpp): every standard mod, head dims 64-256 and q != v, GQA
#     1-8, 1-16 query tokens (16-128 packed rows), contiguous and paged caches (page sizes
#     1-256), the block_n / warps / stages overrides, e4m3 caches (--kv-e4m3) on sm_89 and sm_90a.
# Needs cuobjdump (CUDA's, else set CUOBJDUMP).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

if [ "${1:-}" = --compare ]; then
  [ $# -eq 3 ] || { echo "usage: $0 --compare BEFORE.tsv AFTER.tsv" >&2; exit 2; }
  exec python3 - "$2" "$3" <<'PY'
import collections, re, sys

def load(tsv):
    rows = {}
    for line in open(tsv):
        f = line.rstrip("\n").split("\t")
        rows[f[0]] = f
    return rows

def instructions(path):
    return [l.split(";")[0].strip() for l in open(path) if ";" in l and not l.strip().startswith("/*")]

def erase_registers(i):
    # Register numbers and the operand-reuse flags (a register allocation hint) erased.
    i = re.sub(r"\.reuse\b", "", i)
    i = re.sub(r"\bU?R[0-9]+\b", "R", i)
    i = re.sub(r"\bU?P[0-9]\b", "P", i)
    # Branch targets are addresses: erased too (a moved block shifts them).
    return re.sub(r"0x[0-9a-f]+", "X", i) if re.search(r"\b(BRA|BSSY|CALL|JMP|BRX)\b", i) else i

before, after = load(sys.argv[1]), load(sys.argv[2])
dirs = [p[:-4] + ".sass.d/" for p in sys.argv[1:3]]
kinds, changed = collections.Counter(), []
print("config\tregisters\tspill_st\tspill_ld\tstack\tinstructions\t[kernels]\tsass")
for name in sorted(before):
    if name not in after:
        print(f"{name}\tmissing in {sys.argv[2]}")
        changed.append(name)
        continue
    b, a = before[name], after[name]
    if b[1] == "ERROR" or a[1] == "ERROR":
        print(f"{name}\tcompile error: {b[1:3]} / {a[1:3]}")
        changed.append(name)
        continue
    cols = [b[k] if b[k] == a[k] else f"{b[k]}->{a[k]}" for k in range(2, 7)]
    # Every kernel of the module (column 10, where both runs have it): registers, stack, local.
    if len(b) > 9 and len(a) > 9:
        cols.append(b[9] if b[9] == a[9] else f"{b[9]} -> {a[9]}")
    if any("->" in c for c in cols[:4] + cols[5:]):
        changed.append(name)
    if b[7] == a[7]:
        kind = "identical"
    else:
        ib = [erase_registers(i) for i in instructions(dirs[0] + name + ".sass")]
        ia = [erase_registers(i) for i in instructions(dirs[1] + name + ".sass")]
        if ib == ia:
            kind = "registers renamed"
        elif sorted(ib) == sorted(ia):
            kind = "reordered (%d of %d positions)" % (sum(x != y for x, y in zip(ib, ia)), len(ib))
        else:
            d = collections.Counter(ib)
            d.subtract(collections.Counter(ia))
            kind = "different (%d instructions)" % sum(abs(v) for v in d.values())
    kinds[kind.split(" (")[0]] += 1
    print("\t".join([name] + cols + [kind]))
print(f"# {len(before)} configurations: " + ", ".join(f"{v} {k}" for k, v in kinds.most_common()))
if changed:
    print("# registers, spills or stack changed (or missing): " + " ".join(changed))
sys.exit(1 if changed else 0)
PY
fi

jobs=2
configs=""
family=forward_sm90
while [ $# -gt 0 ]; do
  case "$1" in
    -j) jobs=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --family) family=$2; shift 2 ;;
    *) break ;;
  esac
done
[ $# -eq 2 ] || {
  echo "usage: $0 [-j JOBS] [--family FAMILY] [--configs FILE] FLEXJIT OUT.tsv | --compare A B" >&2
  exit 2
}
# The inspect arguments every configuration of the family starts with.
case "$family" in
  forward_sm90) lead="--arch sm_90a --variant sm90a_wgmma" ;;
  backward_sm90) lead="--arch sm_90a --variant sm90a_wgmma" ;;
  backward_sm80) lead="--variant sm80_mma" ;;
  decode) lead="--kernel decode_split" ;;
  *)
    echo "$0: --family $family: supported: forward_sm90, backward_sm90, backward_sm80, decode" >&2
    exit 2
    ;;
esac
# The decode's L2-hint variants are experimental: listed only with FLEXJIT_ENABLE_VARIANTS.
[ "$family" = decode ] && export FLEXJIT_ENABLE_VARIANTS=${FLEXJIT_ENABLE_VARIANTS:-decode_split/sm80_ef,decode_split/sm80_ef256}
bin=$(readlink -f "$1")
out=$(readlink -f "$2")
sassdir=${out%.tsv}.sass.d
export PATH=/usr/local/cuda/bin:$PATH
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump || true)}
[ -x "$CUOBJDUMP" ] || { echo "$0: no cuobjdump on PATH; set CUOBJDUMP" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$sassdir"
# Mods with several lines, for the configurations below.
OFFSET_CAUSAL=$'buffer q_pos: i32[B]\nmask_mod = q_idx + q_pos[b] >= kv_idx'
DIAG0=$'buffer rel: f16[H, R]\nparam off: i32\nscore_mod = score + 2.0 * rel[h, kv_idx - q_idx + off]\nmask_mod = kv_idx <= q_idx + 50'
DIAG1=$'buffer bias: f32[R]\nparam offset: i32\nscore_mod = where(q_idx >= kv_idx, score + bias[q_idx - kv_idx + offset], score * 0.5)'
DIAG2=$'buffer bias: f32[R]\nparam offset: i32\nscore_mod = score + bias[q_idx - kv_idx + offset] + 0.5 * bias[q_idx - kv_idx + offset - 1]'
export bin work sassdir lead CUOBJDUMP FLEXJIT_CACHE_DIR="$work/cache" OFFSET_CAUSAL DIAG0 DIAG1 DIAG2

one() {
  local line=$1 name args
  name=${line%%|*}
  args=${line#*|}
  # The decode lines that name no variant are the default's: with the hinted variants enabled
  # (below) the planner would pick one of those for them instead.
  if [ "$lead" = "--kernel decode_split" ] && [[ "$args" != *--variant* ]]; then
    args="--variant sm80_mma $args"
  fi
  if ! eval "\"\$bin\" inspect $lead --json -o \"\$work/\$name.cubin\" $args" \
    >"$work/$name.json" 2>"$work/$name.err"; then
    printf '%s\tERROR\t%s\n' "$name" "$(head -c 300 "$work/$name.err" | tr '\n\t' '  ')" \
      >"$work/$name.line"
    return
  fi
  "$CUOBJDUMP" -sass "$work/$name.cubin" 2>/dev/null |
    sed -E 's#/\*[0-9a-f]{4,}\*/##; s/[[:space:]]+$//' >"$sassdir/$name.sass"
  "$CUOBJDUMP" -res-usage "$work/$name.cubin" >"$work/$name.res" 2>/dev/null
  # One file per configuration: the parallel jobs' lines would interleave on a shared pipe.
  python3 - "$work/$name.json" "$sassdir/$name.sass" "$name" "$work/$name.res" \
    >"$work/$name.line" <<'PY'
import hashlib, json, re, sys
j = json.load(open(sys.argv[1]))
sass = open(sys.argv[2], "rb").read()
# Every kernel of the module: "name:REG/STACK/LOCAL", sorted.
res, fn = [], None
for l in open(sys.argv[4]):
    m = re.match(r"\s*Function (\S+):", l)
    if m:
        fn = m.group(1)
        continue
    m = re.search(r"REG:(\d+) STACK:(\d+) .*LOCAL:(\d+)", l)
    if m and fn:
        res.append("%s:%s/%s/%s" % ((fn,) + m.groups()))
        fn = None
ins = [l.split(";")[0].strip() for l in sass.decode().splitlines()
       if ";" in l and not l.strip().startswith("/*")]
print("\t".join(map(str, [sys.argv[3], j["spec"], j["registers"], j["spill_store_bytes"],
                          j["spill_load_bytes"], j["stack_frame_bytes"], len(ins),
                          hashlib.sha256(sass).hexdigest()[:16],
                          hashlib.sha256("\n".join(ins).encode()).hexdigest()[:16],
                          " ".join(sorted(res))])))
PY
}
export -f one

forward_sm90_configs() {
  cat <<'LIST'
alibi-bf16-128|--mods alibi --dtype bf16 -d 128
alibi_causal-bf16-128|--mods alibi_causal --dtype bf16 -d 128
causal-bf16-128|--mods causal --dtype bf16 -d 128
chunked_local-bf16-128|--mods chunked_local --dtype bf16 -d 128
dilated_sliding-bf16-128|--mods dilated_sliding --dtype bf16 -d 128
document-bf16-128|--mods document --dtype bf16 -d 128
document_causal-bf16-128|--mods document_causal --dtype bf16 -d 128
noop-bf16-128|--mods noop --dtype bf16 -d 128
prefix_lm-bf16-128|--mods prefix_lm --dtype bf16 -d 128
relative_bias-bf16-128|--mods relative_bias --dtype bf16 -d 128
relative_bias_causal-bf16-128|--mods relative_bias_causal --dtype bf16 -d 128
sinks-bf16-128|--mods sinks --dtype bf16 -d 128
sinks_sliding_window-bf16-128|--mods sinks_sliding_window --dtype bf16 -d 128
sliding_window-bf16-128|--mods sliding_window --dtype bf16 -d 128
softcap-bf16-128|--mods softcap --dtype bf16 -d 128
softcap_causal-bf16-128|--mods softcap_causal --dtype bf16 -d 128
t5_bucketed_bias-bf16-128|--mods t5_bucketed_bias --dtype bf16 -d 128
alibi_causal-f16-64x64|--mods alibi_causal --dtype f16 -d 64 --head-dim-v 64
softcap-bf16-64x64|--mods softcap --dtype bf16 -d 64 --head-dim-v 64
alibi_causal-f16-256x256|--mods alibi_causal --dtype f16 -d 256 --head-dim-v 256
softcap-bf16-256x256|--mods softcap --dtype bf16 -d 256 --head-dim-v 256
alibi_causal-f16-128x64|--mods alibi_causal --dtype f16 -d 128 --head-dim-v 64
softcap-bf16-128x64|--mods softcap --dtype bf16 -d 128 --head-dim-v 64
alibi_causal-f16-64x256|--mods alibi_causal --dtype f16 -d 64 --head-dim-v 256
softcap-bf16-64x256|--mods softcap --dtype bf16 -d 64 --head-dim-v 256
noop-bn176|--mods noop -d 128 --block-n 176
causal-64-bn176-st4|--mods causal -d 64 --block-n 176 --stages 4
document_causal-128-bn64|--mods document_causal -d 128 --block-n 64
noop-64-bm192|--mods noop -d 64 --block-m 192
causal-64-bm192|--mods causal -d 64 --block-m 192
alibi_causal-64-bm192|--mods alibi_causal -d 64 --block-m 192
softcap_causal-64-bm192|--mods softcap_causal -d 64 --block-m 192
document_causal-64-bm192|--mods document_causal -d 64 --block-m 192
document-64-bm192|--mods document -d 64 --block-m 192
sliding_window-64-bm192|--mods sliding_window -d 64 --block-m 192
prefix_lm-64-bm192|--mods prefix_lm -d 64 --block-m 192
document_causal-64-bm192-bn64|--mods document_causal -d 64 --block-m 192 --block-n 64
document-64-bm192-bn64|--mods document -d 64 --block-m 192 --block-n 64
document-64-bm128|--mods document -d 64 --block-m 128
causal-f16-64-bm192-st2|--mods causal --dtype f16 -d 64 --block-m 192 --stages 2
causal-128x64-bm192-st3|--mods causal -d 128 --head-dim-v 64 --block-m 192 --stages 3
noop-64-bn192|--mods noop -d 64 --block-n 192
causal-f16-64-bn192|--mods causal --dtype f16 -d 64 --block-n 192
noop-64-qt2|--mods noop -d 64 --q-tiles 2
causal-64-qt2|--mods causal -d 64 --q-tiles 2
alibi_causal-64-qt2|--mods alibi_causal -d 64 --q-tiles 2
document_causal-64-qt2|--mods document_causal -d 64 --q-tiles 2
causal-128-qt2-st2|--mods causal -d 128 --q-tiles 2 --stages 2
softcap-f16-256-qt2|--mods softcap --dtype f16 -d 256 --q-tiles 2
relative_bias_causal-128-qt2|--mods relative_bias_causal -d 128 --q-tiles 2
relative_bias_causal-64|--mods relative_bias_causal -d 64
relative_bias-f16-64-bm192|--mods relative_bias --dtype f16 -d 64 --block-m 192
relative_bias_causal-64-bm192|--mods relative_bias_causal -d 64 --block-m 192
relative_bias_causal-64-bn192|--mods relative_bias_causal -d 64 --block-n 192
relative_bias-128x64-bm192-st3|--mods relative_bias -d 128 --head-dim-v 64 --block-m 192 --stages 3
noop-128-pers|--mods noop -d 128 --persistent 1
causal-128-pers|--mods causal -d 128 --persistent 1
alibi_causal-128-pers|--mods alibi_causal -d 128 --persistent 1
relative_bias_causal-128-pers|--mods relative_bias_causal -d 128 --persistent 1
document_causal-128-pers|--mods document_causal -d 128 --persistent 1
causal-64-pers0-qt1|--mods causal -d 64 --persistent 0 --q-tiles 1
noop-96x96|--mods noop -d 96 --head-dim-v 96
causal-96x96|--mods causal -d 96 --head-dim-v 96
alibi_causal-96x96|--mods alibi_causal -d 96 --head-dim-v 96
noop-80x80|--mods noop -d 80 --head-dim-v 80
causal-80x80|--mods causal -d 80 --head-dim-v 80
alibi_causal-80x80|--mods alibi_causal -d 80 --head-dim-v 80
noop-192x128|--mods noop -d 192 --head-dim-v 128
causal-192x128|--mods causal -d 192 --head-dim-v 128
alibi_causal-192x128|--mods alibi_causal -d 192 --head-dim-v 128
noop-96x64|--mods noop -d 96 --head-dim-v 64
causal-96x64|--mods causal -d 96 --head-dim-v 64
alibi_causal-96x64|--mods alibi_causal -d 96 --head-dim-v 64
causal-40|--mods causal -d 40
document_causal-112|--mods document_causal -d 112
softcap-f16-160|--mods softcap --dtype f16 -d 160
causal-192|--mods causal -d 192
alibi_causal-256x128|--mods alibi_causal -d 256 --head-dim-v 128
noop-48-bm192|--mods noop -d 48 --block-m 192
causal-96-pers|--mods causal -d 96 --persistent 1
noop-bf16-64|--mods noop -d 64
causal-bf16-64|--mods causal -d 64
alibi_causal-bf16-64|--mods alibi_causal -d 64
sliding_window-bf16-64|--mods sliding_window -d 64
prefix_lm-bf16-64|--mods prefix_lm -d 64
document_causal-bf16-64|--mods document_causal -d 64
softcap_causal-bf16-64|--mods softcap_causal -d 64
relative_bias_causal-bf16-64|--mods relative_bias_causal -d 64
sinks-bf16-64|--mods sinks -d 64
sinks_sliding_window-bf16-64|--mods sinks_sliding_window -d 64
noop-f16-128|--mods noop --dtype f16 -d 128
causal-f16-128|--mods causal --dtype f16 -d 128
softcap_causal-f16-128|--mods softcap_causal --dtype f16 -d 128
document_causal-f16-128|--mods document_causal --dtype f16 -d 128
causal-128-gqa4|--mods causal -d 128 --gqa 4
alibi_causal-128-gqa4-div|--mods alibi_causal -d 128 --gqa 4 --divisible
causal-128-nofull|--mods causal -d 128 --no-full-blocks
document_causal-64-bm192-div|--mods document_causal -d 64 --block-m 192 --divisible
sinks-256|--mods sinks -d 256
sinks_sliding_window-64-bm192|--mods sinks_sliding_window -d 64 --block-m 192
offset_causal-128-gqa4|--mods "$OFFSET_CAUSAL" -d 128 --gqa 4
diag0-64|--mods "$DIAG0" -d 64
diag0-64-div|--mods "$DIAG0" -d 64 --divisible
diag0-128|--mods "$DIAG0" -d 128
diag0-128-div|--mods "$DIAG0" -d 128 --divisible
diag0-64-bm192|--mods "$DIAG0" -d 64 --block-m 192
diag1-64|--mods "$DIAG1" -d 64
diag1-64-div|--mods "$DIAG1" -d 64 --divisible
diag1-128|--mods "$DIAG1" -d 128
diag1-128-div|--mods "$DIAG1" -d 128 --divisible
diag1-64-bm192|--mods "$DIAG1" -d 64 --block-m 192
diag2-64|--mods "$DIAG2" -d 64
diag2-64-div|--mods "$DIAG2" -d 64 --divisible
diag2-128|--mods "$DIAG2" -d 128
diag2-128-div|--mods "$DIAG2" -d 128 --divisible
diag2-64-bm192|--mods "$DIAG2" -d 64 --block-m 192
cache-causal-128-gqa4-p16|--kernel forward --mods causal -d 128 --gqa 4 --page-size 16
cache-causal-128-gqa4-p16-bm192|--kernel forward --mods causal -d 128 --gqa 4 --page-size 16 --block-m 192 --stages 2 --persistent 0 --q-tiles 1
cache-alibi_causal-128-p1-bm192|--kernel forward --mods alibi_causal -d 128 --page-size 1 --block-m 192 --stages 2 --persistent 0 --q-tiles 1
cache-causal-64-p256-bm192|--kernel forward --mods causal -d 64 --page-size 256 --block-m 192 --persistent 0 --q-tiles 1
causal-128-bm192|--mods causal -d 128 --block-m 192 --stages 2
document_causal-128-bm192|--mods document_causal -d 128 --block-m 192 --stages 2
alibi_causal-128-bm192|--mods alibi_causal -d 128 --block-m 192 --stages 2
noop-128-bm192|--mods noop -d 128 --block-m 192 --stages 2
e4m3-cache-causal-128-gqa4-p16|--kernel forward --mods causal -d 128 --gqa 4 --page-size 16 --kv-e4m3
e4m3-cache-offset_causal-128-gqa4|--kernel forward --mods "$OFFSET_CAUSAL" -d 128 --gqa 4 --kv-e4m3
e4m3-cache-alibi_causal-f16-64-p1|--kernel forward --mods alibi_causal --dtype f16 -d 64 --page-size 1 --kv-e4m3
e4m3-qkv-causal-128|--mods causal --dtype e4m3 -d 128
e4m3-qkv-noop-128|--mods noop --dtype e4m3 -d 128
LIST
}

backward_sm90_configs() {
  cat <<'LIST'
dkdv-alibi-128|--kernel backward_dkdv --mods alibi -d 128
dkdv-alibi_causal-128|--kernel backward_dkdv --mods alibi_causal -d 128
dkdv-causal-128|--kernel backward_dkdv --mods causal -d 128
dkdv-chunked_local-128|--kernel backward_dkdv --mods chunked_local -d 128
dkdv-dilated_sliding-128|--kernel backward_dkdv --mods dilated_sliding -d 128
dkdv-document-128|--kernel backward_dkdv --mods document -d 128
dkdv-document_causal-128|--kernel backward_dkdv --mods document_causal -d 128
dkdv-noop-128|--kernel backward_dkdv --mods noop -d 128
dkdv-prefix_lm-128|--kernel backward_dkdv --mods prefix_lm -d 128
dkdv-relative_bias-128|--kernel backward_dkdv --mods relative_bias -d 128
dkdv-relative_bias_causal-128|--kernel backward_dkdv --mods relative_bias_causal -d 128
dkdv-sinks-128|--kernel backward_dkdv --mods sinks -d 128
dkdv-sinks_sliding_window-128|--kernel backward_dkdv --mods sinks_sliding_window -d 128
dkdv-sliding_window-128|--kernel backward_dkdv --mods sliding_window -d 128
dkdv-softcap-128|--kernel backward_dkdv --mods softcap -d 128
dkdv-softcap_causal-128|--kernel backward_dkdv --mods softcap_causal -d 128
dkdv-t5_bucketed_bias-128|--kernel backward_dkdv --mods t5_bucketed_bias -d 128
dkdv-alibi_causal-f16-64|--kernel backward_dkdv --mods alibi_causal --dtype f16 -d 64
dkdv-softcap-f16-64|--kernel backward_dkdv --mods softcap --dtype f16 -d 64
dkdv-relative_bias_causal-f16-64|--kernel backward_dkdv --mods relative_bias_causal --dtype f16 -d 64
dkdv-document_causal-f16-64|--kernel backward_dkdv --mods document_causal --dtype f16 -d 64
dkdv-alibi_causal-128x64|--kernel backward_dkdv --mods alibi_causal -d 128 --head-dim-v 64
dkdv-softcap_causal-64x128|--kernel backward_dkdv --mods softcap_causal -d 64 --head-dim-v 128
dkdv-causal-96|--kernel backward_dkdv --mods causal -d 96
dkdv-alibi_causal-80|--kernel backward_dkdv --mods alibi_causal -d 80
dkdv-noop-96x64|--kernel backward_dkdv --mods noop -d 96 --head-dim-v 64
dkdv-document_causal-f16-40|--kernel backward_dkdv --mods document_causal --dtype f16 -d 40
dkdv-alibi_causal-128-gqa4|--kernel backward_dkdv --mods alibi_causal -d 128 --gqa 4
dkdv-diag0-64-div|--kernel backward_dkdv --mods "$DIAG0" -d 64 --divisible
dq-alibi-128|--kernel backward_dq --mods alibi -d 128
dq-alibi_causal-128|--kernel backward_dq --mods alibi_causal -d 128
dq-causal-128|--kernel backward_dq --mods causal -d 128
dq-chunked_local-128|--kernel backward_dq --mods chunked_local -d 128
dq-dilated_sliding-128|--kernel backward_dq --mods dilated_sliding -d 128
dq-document-128|--kernel backward_dq --mods document -d 128
dq-document_causal-128|--kernel backward_dq --mods document_causal -d 128
dq-noop-128|--kernel backward_dq --mods noop -d 128
dq-prefix_lm-128|--kernel backward_dq --mods prefix_lm -d 128
dq-relative_bias-128|--kernel backward_dq --mods relative_bias -d 128
dq-relative_bias_causal-128|--kernel backward_dq --mods relative_bias_causal -d 128
dq-sinks-128|--kernel backward_dq --mods sinks -d 128
dq-sinks_sliding_window-128|--kernel backward_dq --mods sinks_sliding_window -d 128
dq-sliding_window-128|--kernel backward_dq --mods sliding_window -d 128
dq-softcap-128|--kernel backward_dq --mods softcap -d 128
dq-softcap_causal-128|--kernel backward_dq --mods softcap_causal -d 128
dq-t5_bucketed_bias-128|--kernel backward_dq --mods t5_bucketed_bias -d 128
dq-alibi_causal-f16-64|--kernel backward_dq --mods alibi_causal --dtype f16 -d 64
dq-softcap-f16-64|--kernel backward_dq --mods softcap --dtype f16 -d 64
dq-relative_bias_causal-f16-64|--kernel backward_dq --mods relative_bias_causal --dtype f16 -d 64
dq-document_causal-f16-64|--kernel backward_dq --mods document_causal --dtype f16 -d 64
dq-alibi_causal-128x64|--kernel backward_dq --mods alibi_causal -d 128 --head-dim-v 64
dq-softcap_causal-64x128|--kernel backward_dq --mods softcap_causal -d 64 --head-dim-v 128
dq-causal-96|--kernel backward_dq --mods causal -d 96
dq-alibi_causal-80|--kernel backward_dq --mods alibi_causal -d 80
dq-noop-96x64|--kernel backward_dq --mods noop -d 96 --head-dim-v 64
dq-document_causal-f16-40|--kernel backward_dq --mods document_causal --dtype f16 -d 40
dq-alibi_causal-128-gqa4|--kernel backward_dq --mods alibi_causal -d 128 --gqa 4
dq-diag0-64-div|--kernel backward_dq --mods "$DIAG0" -d 64 --divisible
dkdv-causal-64-bm128|--kernel backward_dkdv --mods causal -d 64 --block-m 128
dkdv-relative_bias_causal-64-bm128|--kernel backward_dkdv --mods relative_bias_causal -d 64 --block-m 128
dkdv-document_causal-64-bm128|--kernel backward_dkdv --mods document_causal -d 64 --block-m 128
dkdv-alibi_causal-f16-64-bm128|--kernel backward_dkdv --mods alibi_causal --dtype f16 -d 64 --block-m 128
dkdv-noop-128-st3|--kernel backward_dkdv --mods noop -d 128 --stages 3
dq-causal-128-bn128|--kernel backward_dq --mods causal -d 128 --block-n 128
dq-causal-128-bn64|--kernel backward_dq --mods causal -d 128 --block-n 64
LIST
}

backward_sm80_configs() {
  cat <<'LIST'
dkdv-alibi-128|--kernel backward_dkdv --arch sm_80 --mods alibi -d 128
dkdv-alibi_causal-128|--kernel backward_dkdv --arch sm_80 --mods alibi_causal -d 128
dkdv-causal-128|--kernel backward_dkdv --arch sm_80 --mods causal -d 128
dkdv-chunked_local-128|--kernel backward_dkdv --arch sm_80 --mods chunked_local -d 128
dkdv-dilated_sliding-128|--kernel backward_dkdv --arch sm_80 --mods dilated_sliding -d 128
dkdv-document-128|--kernel backward_dkdv --arch sm_80 --mods document -d 128
dkdv-document_causal-128|--kernel backward_dkdv --arch sm_80 --mods document_causal -d 128
dkdv-noop-128|--kernel backward_dkdv --arch sm_80 --mods noop -d 128
dkdv-prefix_lm-128|--kernel backward_dkdv --arch sm_80 --mods prefix_lm -d 128
dkdv-relative_bias-128|--kernel backward_dkdv --arch sm_80 --mods relative_bias -d 128
dkdv-relative_bias_causal-128|--kernel backward_dkdv --arch sm_80 --mods relative_bias_causal -d 128
dkdv-sinks-128|--kernel backward_dkdv --arch sm_80 --mods sinks -d 128
dkdv-sinks_sliding_window-128|--kernel backward_dkdv --arch sm_80 --mods sinks_sliding_window -d 128
dkdv-sliding_window-128|--kernel backward_dkdv --arch sm_80 --mods sliding_window -d 128
dkdv-softcap-128|--kernel backward_dkdv --arch sm_80 --mods softcap -d 128
dkdv-softcap_causal-128|--kernel backward_dkdv --arch sm_80 --mods softcap_causal -d 128
dkdv-t5_bucketed_bias-128|--kernel backward_dkdv --arch sm_80 --mods t5_bucketed_bias -d 128
dkdv-relative_bias_causal-f16-64x64|--kernel backward_dkdv --arch sm_80 --mods relative_bias_causal --dtype f16 -d 64 --head-dim-v 64
dkdv-relative_bias_causal-f16-128x64|--kernel backward_dkdv --arch sm_80 --mods relative_bias_causal --dtype f16 -d 128 --head-dim-v 64
dkdv-relative_bias_causal-f16-256x256|--kernel backward_dkdv --arch sm_80 --mods relative_bias_causal --dtype f16 -d 256 --head-dim-v 256
dkdv-relative_bias_causal-f32-64x64|--kernel backward_dkdv --arch sm_80 --mods relative_bias_causal --dtype f32 -d 64 --head-dim-v 64
dkdv-relative_bias_causal-f32-128x64|--kernel backward_dkdv --arch sm_80 --mods relative_bias_causal --dtype f32 -d 128 --head-dim-v 64
dkdv-relative_bias_causal-f32-256x256|--kernel backward_dkdv --arch sm_80 --mods relative_bias_causal --dtype f32 -d 256 --head-dim-v 256
dkdv-alibi_causal-sm90a-128|--kernel backward_dkdv --arch sm_90a --mods alibi_causal -d 128
dkdv-causal-64-gqa4|--kernel backward_dkdv --arch sm_80 --mods causal -d 64 --gqa 4
dkdv-document_causal-128-div|--kernel backward_dkdv --arch sm_80 --mods document_causal -d 128 --divisible
dkdv-diag0-64|--kernel backward_dkdv --arch sm_80 --mods "$DIAG0" -d 64
dq-alibi-128|--kernel backward_dq --arch sm_80 --mods alibi -d 128
dq-alibi_causal-128|--kernel backward_dq --arch sm_80 --mods alibi_causal -d 128
dq-causal-128|--kernel backward_dq --arch sm_80 --mods causal -d 128
dq-chunked_local-128|--kernel backward_dq --arch sm_80 --mods chunked_local -d 128
dq-dilated_sliding-128|--kernel backward_dq --arch sm_80 --mods dilated_sliding -d 128
dq-document-128|--kernel backward_dq --arch sm_80 --mods document -d 128
dq-document_causal-128|--kernel backward_dq --arch sm_80 --mods document_causal -d 128
dq-noop-128|--kernel backward_dq --arch sm_80 --mods noop -d 128
dq-prefix_lm-128|--kernel backward_dq --arch sm_80 --mods prefix_lm -d 128
dq-relative_bias-128|--kernel backward_dq --arch sm_80 --mods relative_bias -d 128
dq-relative_bias_causal-128|--kernel backward_dq --arch sm_80 --mods relative_bias_causal -d 128
dq-sinks-128|--kernel backward_dq --arch sm_80 --mods sinks -d 128
dq-sinks_sliding_window-128|--kernel backward_dq --arch sm_80 --mods sinks_sliding_window -d 128
dq-sliding_window-128|--kernel backward_dq --arch sm_80 --mods sliding_window -d 128
dq-softcap-128|--kernel backward_dq --arch sm_80 --mods softcap -d 128
dq-softcap_causal-128|--kernel backward_dq --arch sm_80 --mods softcap_causal -d 128
dq-t5_bucketed_bias-128|--kernel backward_dq --arch sm_80 --mods t5_bucketed_bias -d 128
dq-relative_bias_causal-f16-64x64|--kernel backward_dq --arch sm_80 --mods relative_bias_causal --dtype f16 -d 64 --head-dim-v 64
dq-relative_bias_causal-f16-128x64|--kernel backward_dq --arch sm_80 --mods relative_bias_causal --dtype f16 -d 128 --head-dim-v 64
dq-relative_bias_causal-f16-256x256|--kernel backward_dq --arch sm_80 --mods relative_bias_causal --dtype f16 -d 256 --head-dim-v 256
dq-relative_bias_causal-f32-64x64|--kernel backward_dq --arch sm_80 --mods relative_bias_causal --dtype f32 -d 64 --head-dim-v 64
dq-relative_bias_causal-f32-128x64|--kernel backward_dq --arch sm_80 --mods relative_bias_causal --dtype f32 -d 128 --head-dim-v 64
dq-relative_bias_causal-f32-256x256|--kernel backward_dq --arch sm_80 --mods relative_bias_causal --dtype f32 -d 256 --head-dim-v 256
dq-alibi_causal-sm90a-128|--kernel backward_dq --arch sm_90a --mods alibi_causal -d 128
dq-causal-64-gqa4|--kernel backward_dq --arch sm_80 --mods causal -d 64 --gqa 4
dq-document_causal-128-div|--kernel backward_dq --arch sm_80 --mods document_causal -d 128 --divisible
dq-diag0-64|--kernel backward_dq --arch sm_80 --mods "$DIAG0" -d 64
dkdv-alibi_causal-128-det|--kernel backward_dkdv --arch sm_80 --mods alibi_causal -d 128 --deterministic
dkdv-relative_bias_causal-128-det|--kernel backward_dkdv --arch sm_80 --mods relative_bias_causal -d 128 --deterministic
dkdv-t5_bucketed_bias-128-det|--kernel backward_dkdv --arch sm_80 --mods t5_bucketed_bias -d 128 --deterministic
dkdv-sinks-128-det|--kernel backward_dkdv --arch sm_80 --mods sinks -d 128 --deterministic
dkdv-relative_bias_causal-64-det-sm90a|--kernel backward_dkdv --arch sm_90a --mods relative_bias_causal -d 64 --deterministic
dkdv-alibi_causal-256-det|--kernel backward_dkdv --arch sm_80 --mods alibi_causal -d 256 --deterministic
LIST
}

decode_configs() {
  cat <<'LIST'
sm80-noop-128-g4|--arch sm_80 --mods noop -d 128 --gqa 4
sm80-alibi_causal-f16-64-g3-q5-p16|--arch sm_80 --mods alibi_causal --dtype f16 -d 64 --gqa 3 --queries 5 --page-size 16
sm80-relative_bias-256-p256|--arch sm_80 --mods relative_bias -d 256 --page-size 256
sm80-document_causal-128x64-g8-q16-p1|--arch sm_80 --mods document_causal -d 128 --head-dim-v 64 --gqa 8 --queries 16 --page-size 1
sm80-softcap-f16-128-g7-q3|--arch sm_80 --mods softcap --dtype f16 -d 128 --gqa 7 --queries 3
sm90a-noop-128-g4|--arch sm_90a --mods noop -d 128 --gqa 4
sm90a-alibi_causal-f16-64-g3-q5-p16|--arch sm_90a --mods alibi_causal --dtype f16 -d 64 --gqa 3 --queries 5 --page-size 16
sm90a-relative_bias-256-p256|--arch sm_90a --mods relative_bias -d 256 --page-size 256
sm90a-document_causal-128x64-g8-q16-p1|--arch sm_90a --mods document_causal -d 128 --head-dim-v 64 --gqa 8 --queries 16 --page-size 1
sm90a-softcap-f16-128-g7-q3|--arch sm_90a --mods softcap --dtype f16 -d 128 --gqa 7 --queries 3
sm80-t5_bucketed_bias-128-g6-q8-p64|--arch sm_80 --mods t5_bucketed_bias -d 128 --gqa 6 --queries 8 --page-size 64
sm80-sliding_window-128-g6-q8-p64|--arch sm_80 --mods sliding_window -d 128 --gqa 6 --queries 8 --page-size 64
sm80-prefix_lm-128-g6-q8-p64|--arch sm_80 --mods prefix_lm -d 128 --gqa 6 --queries 8 --page-size 64
sm90a-t5_bucketed_bias-64x128-g2-p32|--arch sm_90a --mods t5_bucketed_bias -d 64 --head-dim-v 128 --gqa 2 --page-size 32
sm90a-sliding_window-64x128-g2-p32|--arch sm_90a --mods sliding_window -d 64 --head-dim-v 128 --gqa 2 --page-size 32
sm90a-prefix_lm-64x128-g2-p32|--arch sm_90a --mods prefix_lm -d 64 --head-dim-v 128 --gqa 2 --page-size 32
sm90a-alibi-128-g4|--arch sm_90a --mods alibi -d 128 --gqa 4
sm90a-alibi_causal-128-g4|--arch sm_90a --mods alibi_causal -d 128 --gqa 4
sm90a-causal-128-g4|--arch sm_90a --mods causal -d 128 --gqa 4
sm90a-chunked_local-128-g4|--arch sm_90a --mods chunked_local -d 128 --gqa 4
sm90a-dilated_sliding-128-g4|--arch sm_90a --mods dilated_sliding -d 128 --gqa 4
sm90a-document-128-g4|--arch sm_90a --mods document -d 128 --gqa 4
sm90a-document_causal-128-g4|--arch sm_90a --mods document_causal -d 128 --gqa 4
sm90a-prefix_lm-128-g4|--arch sm_90a --mods prefix_lm -d 128 --gqa 4
sm90a-relative_bias-128-g4|--arch sm_90a --mods relative_bias -d 128 --gqa 4
sm90a-relative_bias_causal-128-g4|--arch sm_90a --mods relative_bias_causal -d 128 --gqa 4
sm90a-sinks-128-g4|--arch sm_90a --mods sinks -d 128 --gqa 4
sm90a-sinks_sliding_window-128-g4|--arch sm_90a --mods sinks_sliding_window -d 128 --gqa 4
sm90a-sliding_window-128-g4|--arch sm_90a --mods sliding_window -d 128 --gqa 4
sm90a-softcap-128-g4|--arch sm_90a --mods softcap -d 128 --gqa 4
sm90a-softcap_causal-128-g4|--arch sm_90a --mods softcap_causal -d 128 --gqa 4
sm90a-t5_bucketed_bias-128-g4|--arch sm_90a --mods t5_bucketed_bias -d 128 --gqa 4
sm80_ef-noop-128-g4|--variant sm80_ef --arch sm_90a --mods noop -d 128 --gqa 4
sm80_ef-noop-128-g4-p16|--variant sm80_ef --arch sm_90a --mods noop -d 128 --gqa 4 --page-size 16
sm80_ef-noop-128-g4-q4|--variant sm80_ef --arch sm_90a --mods noop -d 128 --gqa 4 --queries 4
sm80_ef-alibi_causal-f16-64-g3-q5-p1|--variant sm80_ef --arch sm_90a --mods alibi_causal --dtype f16 -d 64 --gqa 3 --queries 5 --page-size 1
sm80_ef-softcap-128-bn32-w2-st4|--variant sm80_ef --arch sm_80 --mods softcap -d 128 --gqa 4 --block-n 32 --warps 2 --stages 4
sm80_ef-noop-128-bn128-st2|--variant sm80_ef --arch sm_80 --mods noop -d 128 --gqa 4 --block-n 128 --warps 4 --stages 2
sm80_ef256-noop-128-g4|--variant sm80_ef256 --arch sm_90a --mods noop -d 128 --gqa 4
sm80_ef256-noop-128-g4-p16|--variant sm80_ef256 --arch sm_90a --mods noop -d 128 --gqa 4 --page-size 16
sm80_ef256-noop-128-g4-q4|--variant sm80_ef256 --arch sm_90a --mods noop -d 128 --gqa 4 --queries 4
sm80_ef256-alibi_causal-f16-64-g3-q5-p1|--variant sm80_ef256 --arch sm_90a --mods alibi_causal --dtype f16 -d 64 --gqa 3 --queries 5 --page-size 1
sm80_ef256-softcap-128-bn32-w2-st4|--variant sm80_ef256 --arch sm_80 --mods softcap -d 128 --gqa 4 --block-n 32 --warps 2 --stages 4
sm80_ef256-noop-128-bn128-st2|--variant sm80_ef256 --arch sm_80 --mods noop -d 128 --gqa 4 --block-n 128 --warps 4 --stages 2
sm80-softcap-128-bn32-w2-st4|--arch sm_80 --mods softcap -d 128 --gqa 4 --block-n 32 --warps 2 --stages 4
sm80-noop-128-bn128-st2|--arch sm_80 --mods noop -d 128 --gqa 4 --block-n 128 --warps 4 --stages 2
sm80-causal-128-st1|--arch sm_80 --mods causal -d 128 --gqa 4 --stages 1
sm80-causal-256-g1|--arch sm_80 --mods causal -d 256
sm80-noop-128-g8-q16|--arch sm_80 --mods noop -d 128 --gqa 8 --queries 16
sm90a-causal-128-nofull|--arch sm_90a --mods causal -d 128 --gqa 4 --no-full-blocks
e4m3-sm89-noop-128-g4|--arch sm_89 --mods noop -d 128 --gqa 4 --kv-e4m3
e4m3-noop-128-g4|--arch sm_90a --mods noop -d 128 --gqa 4 --kv-e4m3
e4m3-noop-128-g4-p16|--arch sm_90a --mods noop -d 128 --gqa 4 --page-size 16 --kv-e4m3
e4m3-noop-128-g4-q8|--arch sm_90a --mods noop -d 128 --gqa 4 --queries 8 --kv-e4m3
e4m3-alibi_causal-f16-64-g3-q5-p1|--arch sm_90a --mods alibi_causal --dtype f16 -d 64 --gqa 3 --queries 5 --page-size 1 --kv-e4m3
e4m3-sinks-256x128-g8-p256|--arch sm_90a --mods sinks -d 256 --head-dim-v 128 --gqa 8 --page-size 256 --kv-e4m3
LIST
}

if [ -n "$configs" ]; then cat "$configs"; else "${family}_configs"; fi | grep -v '^#' | grep -v '^$' |
  xargs -d '\n' -P "$jobs" -I{} bash -c 'one "$@"' _ {}
cat "$work"/*.line | sort >"$out"
echo "$(wc -l <"$out") configurations -> $out ($(grep -c $'\tERROR\t' "$out" || true) errors)" >&2
