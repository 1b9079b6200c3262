#include "codegen/cuda/SourceAssembly.h"

#include "ir/IR.h"
#include "util/Sha256.h"

#include <fmt/format.h>
#include <nvrtc.h>

namespace flexjit::cuda {

std::string nvrtc_version_string() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return fmt::format("{}.{}", major, minor);
}

namespace {

std::string mods_text_without_defaults(const Mods& mods) {
  Mods m = mods;
  for (Param& p : m.params) {
    auto decl = std::make_shared<ir::ParamDecl>(*p.decl());
    decl->default_value.reset();
    p = Param(std::move(decl));
  }
  return m.to_text();
}

// Text safe inside a `//` comment: no control characters, and no backslash that could splice
// the next source line into the comment.
std::string comment_safe(std::string_view line) {
  std::string s(line);
  for (char& c : s) {
    if (c == '\\' || static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
      c = '?';
    }
  }
  return s;
}

}  // namespace

void section(SourceWriter& w, std::string_view title, std::string_view text) {
  w.line(fmt::format("// ---- {} ----", title));
  w.raw(text);
  w.line("");
}

GeneratedSource assemble_source(std::string kernel_name, const SourceHeader& header,
                                const std::string& body) {
  GeneratedSource out;
  out.kernel_name = std::move(kernel_name);
  out.options = {"-std=c++17"};
  out.source_key = sha256_hex(body);

  SourceWriter head;
  head.line(fmt::format("// flexjit {} {}, generated for NVRTC {}{}", FLEXJIT_VERSION, header.what,
                        nvrtc_version_string(), header.target.empty() ? "" : ", " + header.target));
  head.line("// spec: " + header.spec);
  if (header.mods != nullptr) {
    head.line(fmt::format("// {} (parameter values are kernel arguments):", header.mods_label));
    const std::string text = mods_text_without_defaults(*header.mods);
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      head.line("//   " + comment_safe(std::string_view(text).substr(start, end - start)));
      start = end + 1;
    }
    if (text.empty()) head.line("//   (none)");
  }
  head.line("// source key: " + out.source_key);
  out.source = head.str() + body;
  return out;
}

}  // namespace flexjit::cuda
