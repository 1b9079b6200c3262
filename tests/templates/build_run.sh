#!/bin/sh
# Builds GPU check binaries (run_forward.cu) for a set of configs into $1 (default out/fj):
#   build_run.sh [outdir] [arch]   then run the binaries on a GPU machine (see run_all.sh).
# Each line: name mods kind dtype dqk dv bm bn warps stages gqa divisible full score mask
set -e
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-out/fj}
arch=${2:-sm_90}
mkdir -p "$out"
build() {
  name=$1; mods=$2; kind=$3; shift 3
  "$here/compose.sh" "$mods" "$@" >"$out/$name.cuh"
  nvcc -O3 -std=c++17 -arch=$arch -I"$here" -DFJ_KERNEL_TU="\"$(cd "$out" && pwd)/$name.cuh\"" \
    -DFJ_MODS_KIND=$kind -DFJ_MODS_NAME="\"$name\"" -o "$out/$name" "$here/run_forward.cu" &
}
while read -r line; do
  case "$line" in ''|\#*) continue ;; esac
  build $line
  [ "$(jobs -p | wc -l)" -ge 2 ] && wait -n 2>/dev/null || wait
done <"${FJ_RUN_CONFIGS:-$here/run_configs.txt}"
wait
