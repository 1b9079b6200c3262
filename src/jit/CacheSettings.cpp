#include "jit/CacheSettings.h"

#include "util/Env.h"

#include <unistd.h>

#include <string>

namespace flexjit::jit {

CacheSettings CacheSettings::from_env() {
  CacheSettings s;
  s.enabled = !env::flag("FLEXJIT_DISABLE_CACHE");
  if (auto dir = env::get("FLEXJIT_CACHE_DIR")) {
    s.dir = *dir;
  } else if (auto xdg = env::get("XDG_CACHE_HOME"); xdg && xdg->front() == '/') {
    s.dir = std::filesystem::path(*xdg) / "flexjit";
  } else if (auto home = env::get("HOME")) {
    s.dir = std::filesystem::path(*home) / ".cache" / "flexjit";
  } else {
    // Per user: a shared name would let whoever creates it first serve kernels to everyone.
    std::error_code ec;
    std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
    if (ec) tmp = "/tmp";
    s.dir = tmp / ("flexjit-cache-" + std::to_string(static_cast<unsigned long>(::geteuid())));
  }
  if (auto dump = env::get("FLEXJIT_DUMP_DIR")) s.dump_dir = *dump;
  return s;
}

}  // namespace flexjit::jit
