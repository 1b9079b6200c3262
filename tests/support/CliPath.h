// Where the flexjit CLI binary is, for tests that run it: $FLEXJIT_CLI, else `flexjit` beside the
// test binary (the build folder, also when the build is carried to another machine), else the
// path CMake configured.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace flexjit::test {

inline std::string cli_path() {
  if (const char* env = std::getenv("FLEXJIT_CLI"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto beside = self.parent_path() / "flexjit";
    if (std::filesystem::exists(beside, ec)) return beside.string();
  }
  return FLEXJIT_CLI_PATH;
}

}  // namespace flexjit::test
