// Helpers for the cache tests: temp directories, environment overrides, small NVRTC requests,
// synthetic entries, captured stderr, and running code as another user.
#pragma once

#include "jit/KernelCompiler.h"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

namespace flexjit::test {

namespace fs = std::filesystem;

// A fresh directory under /tmp, removed with its contents at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "flexjit-test-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Sets (or unsets, with nullptr) an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Everything written to stderr (fd 2) while it lives; text() returns it so far.
class CaptureStderr {
 public:
  CaptureStderr() {
    std::fflush(stderr);
    saved_ = ::dup(2);
    std::string tmpl = (fs::temp_directory_path() / "flexjit-stderr-XXXXXX").string();
    int fd = ::mkstemp(tmpl.data());
    REQUIRE(fd >= 0);
    path_ = tmpl;
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~CaptureStderr() {
    restore();
    std::error_code ec;
    fs::remove(path_, ec);
  }
  std::string text() {
    std::fflush(stderr);
    std::ifstream in(path_, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }

 private:
  int saved_ = -1;
  fs::path path_;
};

inline jit::CompileRequest small_request(int variant = 0) {
  std::string source =
      "extern \"C\" __global__ void scale(float* x, float s, int n) {\n"
      "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
      "  if (i < n) x[i] = x[i] * s + " +
      std::to_string(variant) + ".f;\n}\n";
  return jit::CompileRequest{source, "scale", "sm_80", {}, "scale v" + std::to_string(variant)};
}

inline jit::CacheSettings settings_in(const fs::path& dir) {
  jit::CacheSettings s;
  s.dir = dir;
  return s;
}

inline std::vector<fs::path> files_with_suffix(const fs::path& dir, const std::string& suffix) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.size() >= suffix.size() &&
        n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(e.path());
  }
  return out;
}

inline std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

inline void write_all(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// A synthetic entry (no NVRTC) of about `size` bytes.
inline jit::CompiledKernel fake_kernel(const std::string& key, size_t size, char fill = 'c') {
  jit::CompiledKernel k;
  k.key = key;
  k.arch = "sm_80";
  k.kernel_name = "fake";
  k.label = "fake " + key.substr(0, 4);
  k.cubin.assign(size, fill);
  k.usage.registers = 32;
  return k;
}

inline std::string fake_key(char c) {
  return std::string(64, c);
}

inline bool is_root() {
  return ::geteuid() == 0;
}

// The uid/gid of `nobody`, for ownership tests run as root.
constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;

// Runs `body` in a forked child (as `nobody` when `as_nobody`) and returns its exit status
// (-1 if it did not exit normally). body's return value is the exit status; an exception is 99.
inline int in_child(const std::function<int()>& body, bool as_nobody = false) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int status = 98;
    try {
      if (as_nobody && (::setgroups(0, nullptr) != 0 || ::setresgid(kNogroup, kNogroup, kNogroup) ||
                        ::setresuid(kNobody, kNobody, kNobody) != 0)) {
        ::_exit(97);
      }
      status = body();
    } catch (...) {
      status = 99;
    }
    std::fflush(nullptr);
    ::_exit(status);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace flexjit::test
