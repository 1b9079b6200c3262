#!/bin/sh
# Compiles stand-in kernels with nvcc for one arch and prints registers / spills / smem per
# config; with -sass also counts HMMA / LDSM / LDGSTS instructions.
#   check_ptxas.sh [arch] [-sass]
arch=${1:-sm_80}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
while read -r mods dtype dqk dv bm bn w s gqa div full sm mm; do
  case "$mods" in ''|\#*) continue ;; esac
  "$here/compose.sh" "$mods" "$dtype" "$dqk" "$dv" "$bm" "$bn" "$w" "$s" "$gqa" "$div" "$full" "$sm" "$mm" >"$tmp/k.cu"
  info=$(nvcc -cubin -arch="$arch" -Xptxas -v -o "$tmp/k.cubin" "$tmp/k.cu" 2>&1 | grep -E "registers|spill|error" | tr '\n' ' ' | sed 's/ptxas info    ://g')
  line="$mods $dtype d=$dqk/$dv ${bm}x$bn w$w s$s div=$div: $info"
  if [ "$2" = "-sass" ]; then
    sass=$(cuobjdump -sass "$tmp/k.cubin")
    line="$line HMMA=$(echo "$sass" | grep -c HMMA) LDSM=$(echo "$sass" | grep -c LDSM) LDGSTS=$(echo "$sass" | grep -c LDGSTS)"
  fi
  echo "$line"
done <<CONFIGS
${FJ_CONFIGS:-$(cat "$here/configs.txt")}
CONFIGS
rm -rf "$tmp"
