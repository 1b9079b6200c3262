// Where the flexjit CLI binary is, for tests that run it: $FLEXJIT_CLI, else `flexjit` beside the
// test binary (the build folder, also when the build is carried to another machine), else the
// path CMake configured.
#pragma once

#include <sys/wait.h>

#include <cstdio>
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

// Runs the CLI with `args` through sh, after `prefix` (environment assignments, `timeout 60`);
// returns its exit status (-1 if it did not exit normally) and puts stdout and stderr together
// into *output.
inline int run_cli(const std::string& args, std::string* output, const std::string& prefix = {}) {
  const std::string cmd = prefix + " '" + cli_path() + "' " + args + " 2>&1";
  output->clear();
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p))
    output->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace flexjit::test
