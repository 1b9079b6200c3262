#!/bin/sh
# Prints one flexjit forward translation unit, in the order the codegen concatenates it:
#   compose.sh MODS DTYPE DQK DV BM BN WARPS STAGES GQA DIVISIBLE FULL SCORE MASK
# e.g. compose.sh mods_causal.cuh fj_bf16 128 128 128 64 4 2 1 false true false true
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
echo "// flexjit test TU: $*"
cat "$root/templates/flexjit_abi.h" "$root/templates/prelude.cuh"
cat <<CFG
struct FjConfig {
  static constexpr int kBlockM = $5, kBlockN = $6, kNumWarps = $7, kNumStages = $8;
  static constexpr int kHeadDimQK = $3, kHeadDimV = $4, kGqaRatio = $9;
  static constexpr bool kIsDivisible = ${10}, kHasFullBlocks = ${11};
  static constexpr bool kHasScoreMod = ${12}, kHasMaskMod = ${13};
  using Element = $2;
};
CFG
cat "$root/tests/templates/$1" "$root/templates/mma_sm80.cuh" "$root/templates/attention_sm80.cuh" "$root/templates/forward_sm80.cuh"
