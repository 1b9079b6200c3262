// Assembly of a forward kernel's CUDA source: one self-contained translation unit (no
// #include at all, so NVRTC needs no headers and a cold compile stays short), in this order:
//
//   1. a comment block: flexjit and NVRTC versions, arch, ForwardSpec::str(), the mods as text
//      (parameter default values left out: they are kernel arguments, not source), and
//      `// source key: <sha256>` as its last line: SHA-256 of all the text after that line;
//   2. templates/flexjit_abi.h   3. templates/prelude.cuh
//   4. struct FjConfig (generate_config)   5. the mods (generate_mod_functions)
//   6. templates/forward_sm80.cuh, which defines
//      extern "C" __global__ void flexjit_forward(const FjFwdArgs args, const FjModParams mods)
//
// The source depends only on what shapes the binary: mods that are equal (Mods::hash) give
// byte-identical source; a changed parameter default or Mods::name does not change it.
#pragma once

#include "codegen/cuda/ForwardSpec.h"

#include <flexjit/mods.h>

#include <string>
#include <string_view>
#include <vector>

namespace flexjit::cuda {

struct GeneratedSource {
  std::string source;                // the whole translation unit
  std::string kernel_name;           // "flexjit_forward" (extern "C": not mangled)
  std::vector<std::string> options;  // NVRTC options besides the arch ("-std=c++17")
  std::string source_key;            // SHA-256 (hex) of the source after the "source key" line
};

// The template texts spliced around the generated parts.
struct ForwardTemplates {
  std::string_view abi;      // templates/flexjit_abi.h
  std::string_view prelude;  // templates/prelude.cuh
  std::string_view kernel;   // templates/forward_sm80.cuh
  std::string_view mma;      // templates/mma_sm80.cuh: tile helpers, spliced before `kernel`
};

// The embedded templates (throws InternalError if one is not embedded in this build).
ForwardTemplates embedded_forward_templates();

// Validates `spec` (UnsupportedError) and type-checks `mods` (CompileError), then assembles the
// source with the embedded templates.
GeneratedSource generate_forward(const Mods& mods, const ForwardSpec& spec);
// The same with explicit template texts (tests, experiments with modified templates).
GeneratedSource generate_forward(const Mods& mods, const ForwardSpec& spec,
                                 const ForwardTemplates& templates);

// The compile-time configuration the kernel template reads:
//   struct FjConfig { static constexpr int kBlockM = ..., kBlockN, kNumWarps, kNumStages,
//     kHeadDimQK, kHeadDimV, kGqaRatio; static constexpr bool kIsDivisible, kHasFullBlocks,
//     kHasScoreMod, kHasMaskMod; using Element = fj_bf16 | fj_f16 | float; };
// kHasScoreMod / kHasMaskMod are false for absent or identity mods (see ModCodegen.h).
std::string generate_config(const Mods& mods, const ForwardSpec& spec);

// "13.0": the version of the NVRTC library flexjit is linked against.
std::string nvrtc_version_string();

}  // namespace flexjit::cuda
