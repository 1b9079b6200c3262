// The cache key of a compile: what identifies its cubin in the memory and disk caches.
#pragma once

#include "jit/Nvrtc.h"

#include <string>

namespace flexjit::jit {

// Bumped whenever the key's inputs or the disk file format change; old entries then miss.
constexpr int kCacheFormatVersion = 1;

// SHA-256 (64 hex digits) over, each length-prefixed: the cache format version, the source, the
// sorted NVRTC options (nvrtc_options(): defaults, arch and req.options), the NVRTC version, the
// arch and the kernel name. The label is not part of the key: it names, it does not shape.
std::string cache_key(const CompileRequest& req);

}  // namespace flexjit::jit
