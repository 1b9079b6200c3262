// The parts every generated CUDA translation unit shares (ForwardSource, BlockMaskSource,
// ReferenceSource): `// ---- name ----` sections, and the comment block on top (flexjit and
// NVRTC versions, the spec, the mods as text, `// source key: <sha256>` of the text after it).
#pragma once

#include "codegen/cuda/ForwardSource.h"
#include "codegen/cuda/SourceWriter.h"

#include <flexjit/mods.h>

#include <string>
#include <string_view>

namespace flexjit::cuda {

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
