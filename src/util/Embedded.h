// Files embedded in the library at build time (cmake/Embed.cmake): the kernel templates and the
// standard mods, so that no source tree is needed at run time.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace flexjit::embedded {

struct File {
  const char* name;  // path relative to templates/ or dsl/: "forward_sm80.cuh", "alibi.fx"
  const char* data;  // NUL-terminated
  size_t size;
  std::string_view text() const { return {data, size}; }
};

const std::vector<File>& templates();  // templates/*.cuh, *.h
const std::vector<File>& dsl();        // dsl/*.fx

// The template named `name`; throws InternalError if it is not embedded.
std::string_view template_text(std::string_view name);

}  // namespace flexjit::embedded
