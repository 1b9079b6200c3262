#!/usr/bin/env bash
# SASS fingerprints of the sm_90a forward kernels, to prove a template change SASS-neutral
# without a GPU (docs/kernels/forward_sm90.md "Code structure").
#
#   scripts/sass_fingerprint.sh [-j JOBS] [--configs FILE] FLEXJIT OUT.tsv
#       Compiles every configuration through `FLEXJIT inspect` (NVRTC, a fresh cache) and writes
#       one line per configuration: name, spec, registers (the launch bound), spill stores,
#       spill loads, stack frame, SASS instructions, a hash of the SASS (addresses stripped,
#       encodings kept) and a hash of its instruction text; the SASS goes to OUT.sass.d/.
#   scripts/sass_fingerprint.sh --compare BEFORE.tsv AFTER.tsv
#       Compares two such runs configuration by configuration: resources, and whether the SASS
#       is identical, identical but for register numbers (and reuse flags), the same
#       instructions reordered, or different (how many instructions, registers erased). Exits 1
#       if any configuration's registers, spills or stack changed.
#
# Typical use: build the binary before the change, copy it aside (the templates are embedded in
# it), build after, run both and compare:
#   cp build/flexjit /tmp/flexjit.before   # (at the old commit)
#   scripts/sass_fingerprint.sh /tmp/flexjit.before /tmp/before.tsv
#   scripts/sass_fingerprint.sh build/flexjit /tmp/after.tsv
#   scripts/sass_fingerprint.sh --compare /tmp/before.tsv /tmp/after.tsv
# The default configurations are those the unit tests compile for forward/sm90a_wgmma
# (tests/unit/test_forward_sm90.cpp) plus the bench's and the sinks': every standard mod, head
# dims 40..256 and q != v, 128- and 192-row tiles, q_tiles 2, persistent CTAs, bf16 / f16, GQA,
# divisible lengths, diagonal loads. --configs FILE: lines "name|inspect arguments" (# comments).
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
print("config\tregisters\tspill_st\tspill_ld\tstack\tinstructions\tsass")
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
    if any("->" in c for c in cols[:4]):
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
while [ $# -gt 0 ]; do
  case "$1" in
    -j) jobs=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    *) break ;;
  esac
done
[ $# -eq 2 ] || { echo "usage: $0 [-j JOBS] [--configs FILE] FLEXJIT OUT.tsv | --compare A B" >&2; exit 2; }
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
export bin work sassdir CUOBJDUMP FLEXJIT_CACHE_DIR="$work/cache" OFFSET_CAUSAL DIAG0 DIAG1 DIAG2

one() {
  local line=$1 name args
  name=${line%%|*}
  args=${line#*|}
  if ! eval "\"\$bin\" inspect --arch sm_90a --variant sm90a_wgmma --json -o \"\$work/\$name.cubin\" $args" \
    >"$work/$name.json" 2>"$work/$name.err"; then
    printf '%s\tERROR\t%s\n' "$name" "$(head -c 300 "$work/$name.err" | tr '\n\t' '  ')" \
      >"$work/$name.line"
    return
  fi
  "$CUOBJDUMP" -sass "$work/$name.cubin" 2>/dev/null |
    sed -E 's#/\*[0-9a-f]{4,}\*/##; s/[[:space:]]+$//' >"$sassdir/$name.sass"
  # One file per configuration: the parallel jobs' lines would interleave on a shared pipe.
  python3 - "$work/$name.json" "$sassdir/$name.sass" "$name" >"$work/$name.line" <<'PY'
import hashlib, json, sys
j = json.load(open(sys.argv[1]))
sass = open(sys.argv[2], "rb").read()
ins = [l.split(";")[0].strip() for l in sass.decode().splitlines()
       if ";" in l and not l.strip().startswith("/*")]
print("\t".join(map(str, [sys.argv[3], j["spec"], j["registers"], j["spill_store_bytes"],
                          j["spill_load_bytes"], j["stack_frame_bytes"], len(ins),
                          hashlib.sha256(sass).hexdigest()[:16],
                          hashlib.sha256("\n".join(ins).encode()).hexdigest()[:16]])))
PY
}
export -f one

default_configs() {
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
LIST
}

if [ -n "$configs" ]; then cat "$configs"; else default_configs; fi | grep -v '^#' | grep -v '^$' |
  xargs -d '\n' -P "$jobs" -I{} bash -c 'one "$@"' _ {}
cat "$work"/*.line | sort >"$out"
echo "$(wc -l <"$out") configurations -> $out ($(grep -c $'\tERROR\t' "$out" || true) errors)" >&2
