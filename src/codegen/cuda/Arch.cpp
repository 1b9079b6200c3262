#include "codegen/cuda/Arch.h"

#include <flexjit/error.h>

#include "util/Suggest.h"

#include <fmt/format.h>

#include <initializer_list>

namespace flexjit::cuda {

const char* supported_archs() {
  return "sm_80, sm_86, sm_89, sm_90, sm_90a";
}

int max_smem_per_block(const Arch& arch) {
  switch (arch.cc()) {
    case 80:
      return 163 * 1024;
    case 86:
    case 89:
      return 99 * 1024;
    case 90:
      return 227 * 1024;
    default:
      break;
  }
  FJ_ASSERT(false, "max_smem_per_block of an arch Arch::parse does not accept");
}

Arch Arch::parse(const std::string& s) {
  const std::initializer_list<const char*> known = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"};
  for (const char* k : known) {
    if (s != k) continue;
    Arch a;
    a.major = k[3] - '0';
    a.minor = k[4] - '0';
    a.accelerated = k[5] == 'a';
    return a;
  }
  throw UnsupportedError(fmt::format("unsupported CUDA arch '{}'{}: supported are {}", s,
                                     did_you_mean(s, {known.begin(), known.end()}),
                                     supported_archs()));
}

std::string Arch::str() const {
  return fmt::format("sm_{}{}{}", major, minor, accelerated ? "a" : "");
}

}  // namespace flexjit::cuda
