#include "cp/NcclLibrary.h"

#include <flexjit/error.h>

#include "util/Env.h"

#include <fmt/format.h>

#include <dlfcn.h>
#include <glob.h>

#include <cstdlib>
#include <sstream>
#include <vector>

namespace flexjit::cp {

namespace {

constexpr const char* kSoname = "libnccl.so.2";

// site-packages/nvidia/nccl/lib/libnccl.so.2 under the Python environment at `prefix`.
std::vector<std::string> python_env_candidates(const std::string& prefix) {
  std::vector<std::string> out;
  const std::string pattern = prefix + "/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2";
  glob_t g{};
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i)
      out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  return out;
}

// The Python environments of step 4 (NcclLibrary.h), each once, in order.
std::vector<std::string> python_env_prefixes() {
  std::vector<std::string> prefixes;
  auto add = [&](std::string p) {
    while (p.size() > 1 && p.back() == '/')
      p.pop_back();
    if (p.empty()) return;
    for (const std::string& q : prefixes)
      if (q == p) return;
    prefixes.push_back(std::move(p));
  };
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    if (const char* v = std::getenv(var)) add(v);
  }
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    std::string dir;
    while (std::getline(ss, dir, ':')) {
      while (dir.size() > 1 && dir.back() == '/')
        dir.pop_back();
      if (dir.size() > 4 && dir.compare(dir.size() - 4, 4, "/bin") == 0) {
        add(dir.substr(0, dir.size() - 4));
      }
    }
  }
  return prefixes;
}

std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dlopen error";
}

}  // namespace

const Nccl& Nccl::get() {
  static const Nccl nccl;
  return nccl;
}

bool Nccl::resolve(void* lib, const std::string& from) {
#define FLEXJIT_NCCL_RESOLVE(name, ret, params)                                                \
  name##_ = reinterpret_cast<ret(*) params>(dlsym(lib, #name));                                \
  if (name##_ == nullptr) {                                                                    \
    reason_ += fmt::format("\n  {}: loaded, but it does not export {} (NCCL older than 2.7?)", \
                           from, #name);                                                       \
    return false;                                                                              \
  }
  FLEXJIT_NCCL_FUNCTIONS(FLEXJIT_NCCL_RESOLVE)
#undef FLEXJIT_NCCL_RESOLVE
  if (ncclGetVersion_(&version_) != kNcclSuccess) version_ = 0;
  loaded_from_ = from;
  available_ = true;
  return true;
}

Nccl::Nccl() {
  // The handle is never closed: communicators live as long as the process may use them.
  // 1. A copy the process already has.
  if (void* lib = dlopen(kSoname, RTLD_NOW | RTLD_NOLOAD)) {
    if (resolve(lib, fmt::format("{} (already loaded)", kSoname))) return;
  } else {
    reason_ += fmt::format("\n  {} already loaded: no", kSoname);
  }
  // 2. The file the user names.
  if (const auto path = env::get("FLEXJIT_NCCL_LIBRARY")) {
    if (void* lib = dlopen(path->c_str(), RTLD_NOW | RTLD_LOCAL)) {
      if (resolve(lib, *path)) return;
    } else {
      reason_ += fmt::format("\n  FLEXJIT_NCCL_LIBRARY={}: {}", *path, dl_error());
    }
  } else {
    reason_ += "\n  FLEXJIT_NCCL_LIBRARY: not set";
  }
  // 3. The dynamic loader's search.
  if (void* lib = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL)) {
    if (resolve(lib, kSoname)) return;
  } else {
    reason_ += fmt::format("\n  {} through the loader: {}", kSoname, dl_error());
  }
  // 4. Python environments (the nvidia-nccl-cu* wheels).
  const std::vector<std::string> prefixes = python_env_prefixes();
  for (const std::string& prefix : prefixes) {
    for (const std::string& file : python_env_candidates(prefix)) {
      if (void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL)) {
        if (resolve(lib, file)) return;
      } else {
        reason_ += fmt::format("\n  {}: {}", file, dl_error());
      }
    }
  }
  reason_ += fmt::format(
      "\n  site-packages/nvidia/nccl/lib/{} of the Python environments at {}: none found", kSoname,
      prefixes.empty() ? std::string("(none)") : fmt::format("{}", fmt::join(prefixes, ", ")));
}

void Nccl::require() const {
  if (available_) return;
  throw RuntimeError(fmt::format(
      "NCCL unavailable (context parallelism runs on NCCL; set FLEXJIT_NCCL_LIBRARY to the "
      "path of libnccl.so.2, e.g. site-packages/nvidia/nccl/lib/libnccl.so.2 of the "
      "nvidia-nccl-cu13 wheel). Tried:{}",
      reason_));
}

void nccl_check(NcclResult r, const char* call, const std::string& what) {
  if (r == kNcclSuccess) return;
  const Nccl& n = Nccl::get();
  const char* text = n.ncclGetErrorString_ ? n.ncclGetErrorString_(r) : nullptr;
  throw RuntimeError(fmt::format("{} failed{}{}: NCCL error {} ({})", call,
                                 what.empty() ? "" : " for ", what, r,
                                 text ? text : "no description"));
}

}  // namespace flexjit::cp
