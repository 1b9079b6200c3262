#!/bin/sh
# Compiles stand-in kernels with nvcc for one arch and prints registers / spills / smem per
# config; with -ptx also counts mma.sync / ldmatrix / cp.async in the PTX (this machine has no
# cuobjdump; where it exists, `cuobjdump -sass` shows them as HMMA / LDSM / LDGSTS).
#   check_ptxas.sh [arch] [-ptx]
arch=${1:-sm_80}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
while read -r mods dtype dqk dv bm bn w s gqa div full sm mm; do
  case "$mods" in ''|\#*) continue ;; esac
  "$here/compose.sh" "$mods" "$dtype" "$dqk" "$dv" "$bm" "$bn" "$w" "$s" "$gqa" "$div" "$full" "$sm" "$mm" >"$tmp/k.cu"
  info=$(nvcc -cubin -arch="$arch" -Xptxas -v -o "$tmp/k.cubin" "$tmp/k.cu" 2>&1 | grep -E "registers|spill|error" | tr '\n' ' ' | sed 's/ptxas info    ://g')
  line="$mods $dtype d=$dqk/$dv ${bm}x$bn w$w s$s div=$div: $info"
  if [ "$2" = "-ptx" ]; then
    nvcc -ptx -arch="$arch" -o "$tmp/k.ptx" "$tmp/k.cu"
    line="$line mma=$(grep -c mma.sync "$tmp/k.ptx") ldmatrix=$(grep -c ldmatrix "$tmp/k.ptx") cp.async=$(grep -c 'cp.async.cg' "$tmp/k.ptx")"
  fi
  echo "$line"
done <<CONFIGS
${FJ_CONFIGS:-$(cat "$here/configs.txt")}
CONFIGS
rm -rf "$tmp"
