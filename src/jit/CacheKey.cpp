#include "jit/CacheKey.h"

#include "util/Sha256.h"

#include <algorithm>

namespace flexjit::jit {

std::string cache_key(const CompileRequest& req) {
  std::vector<std::string> opts = nvrtc_options(req);
  // Sorted: the same options given in another order make the same binary.
  std::sort(opts.begin(), opts.end());
  Sha256 h;
  h.update_field("flexjit-cache-format-" + std::to_string(kCacheFormatVersion));
  h.update_field(req.source);
  h.update_field(std::to_string(opts.size()));
  for (const auto& o : opts)
    h.update_field(o);
  h.update_field(nvrtc_version());
  h.update_field(req.arch);
  h.update_field(req.kernel_name);
  return h.hex();
}

}  // namespace flexjit::jit
