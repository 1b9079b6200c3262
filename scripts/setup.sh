#!/usr/bin/env bash
# Set-up and main job on a fresh machine: install what is missing, build (Release), emit and
# compile a standard mod's forward kernel, then run a real attention (GPU, else the CPU backend).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXJIT_BUILD_TESTS=OFF >/dev/null
ninja -C build flexjit-cli
arch_flag=()
if ! nvidia-smi >/dev/null 2>&1; then arch_flag=(--arch sm_90a); fi
echo "== flexjit mods check alibi_causal"
build/flexjit mods check alibi_causal
echo "== flexjit emit --mods alibi_causal ${arch_flag[*]} -o build/alibi_causal_forward.cu"
build/flexjit emit --mods alibi_causal "${arch_flag[@]}" -o build/alibi_causal_forward.cu
echo "== flexjit compile --mods alibi_causal ${arch_flag[*]}"
build/flexjit compile --mods alibi_causal "${arch_flag[@]}"
echo "== again: served from the disk cache"
build/flexjit compile --mods alibi_causal "${arch_flag[@]}"
# A real attention: on the GPU when there is one, else on the CPU backend (LLVM JIT), checked
# against the CPU backend's fp64 reference mode.
echo "== flexjit run --device auto --mods alibi_causal --random 1,8,1024,64 --check"
build/flexjit run --device auto --mods alibi_causal --random 1,8,1024,64 --check
