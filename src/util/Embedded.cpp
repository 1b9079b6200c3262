#include "util/Embedded.h"

#include <flexjit/error.h>

namespace flexjit::embedded {

std::string_view template_text(std::string_view name) {
  for (const auto& f : templates()) {
    if (name == f.name) return f.text();
  }
  FJ_ASSERT(false, "template not embedded: " + std::string(name));
}

}  // namespace flexjit::embedded
