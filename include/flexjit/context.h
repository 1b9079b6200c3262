// Context: one GPU, its kernel caches and loaded modules. Create one per device and reuse it:
// kernels compiled for one call are served from memory to every later call with the same mods
// structure and shapes.
#pragma once

#include <flexjit/export.h>

#include <memory>
#include <string>

namespace flexjit {

struct ContextOptions {
  int device = 0;              // CUDA device ordinal
  std::string cache_dir;       // empty: $FLEXJIT_CACHE_DIR, else $XDG_CACHE_HOME/flexjit, ...
  bool disable_cache = false;  // no disk or memory caching of compiled kernels
};

class FLEXJIT_API Context {
 public:
  // Retains the device's primary context. Throws RuntimeError when no GPU or driver is present
  // (the message says why) and CacheError when the cache directory is unusable.
  explicit Context(ContextOptions options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  std::string device_name() const;  // "NVIDIA H100 80GB HBM3"
  std::string arch() const;         // the NVRTC target: "sm_90a"
  int sm_count() const;
  // Waits for all work on the device; a kernel fault surfaces here as RuntimeError.
  void synchronize() const;

  // Opaque internal state (src/plan/ContextImpl.h).
  struct Impl;

 private:
  friend struct ContextAccess;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flexjit
