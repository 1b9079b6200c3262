// The parts every generated CUDA translation unit shares (each kernel variant's source, see
// kernels/Variant.h): `// ---- name ----` sections, and the comment block on top (flexjit and
// NVRTC versions, the kernel description, the mods as text, `// source key: <sha256>` of the
// text after it).
#pragma once

#include "codegen/cuda/SourceWriter.h"

#include <flexjit/mods.h>

#include <string>
#include <string_view>
#include <vector>

namespace flexjit::cuda {

struct GeneratedSource {
  std::string source;                // the whole translation unit
  std::string kernel_name;           // the main entry point (extern "C": not mangled)
  std::vector<std::string> options;  // NVRTC options besides the arch ("-std=c++17")
  std::string source_key;            // SHA-256 (hex) of the source after the "source key" line
};

// "13.0": the version of the NVRTC library flexjit is linked against.
std::string nvrtc_version_string();

// Appends `// ---- title ----`, `text` verbatim and an empty line.
void section(SourceWriter& w, std::string_view title, std::string_view text);

// What the comment block on top of a generated source says.
struct SourceHeader {
  std::string what;    // "forward kernel `flexjit_forward`"
  std::string target;  // "sm_90", or empty where the source does not depend on the arch
  std::string spec;    // the spec line
  // Listed line by line, without parameter defaults (a default is a kernel argument, so the
  // source and its key must not change with it); nullptr lists none.
  const Mods* mods = nullptr;
  std::string mods_label = "mods";  // "// <label> (parameter values are kernel arguments):"
};

// The finished source: the comment block of `header`, then `body`. The source key is the
// SHA-256 of `body`; options are {"-std=c++17"}.
GeneratedSource assemble_source(std::string kernel_name, const SourceHeader& header,
                                const std::string& body);

}  // namespace flexjit::cuda
