#include "Pipeline.h"

#include "passes/CSE.h"
#include "passes/Simplify.h"
#include "passes/TypeCheck.h"
#include "util/Log.h"

#include <xxhash.h>

#include <chrono>

namespace flexjit {

namespace {

uint64_t spec_hash(const cuda::ForwardSpec& s) {
  const int64_t fields[] = {static_cast<int64_t>(s.dtype),
                            s.head_dim_qk,
                            s.head_dim_v,
                            s.gqa_ratio,
                            s.is_divisible,
                            s.has_full_blocks,
                            s.arch.major,
                            s.arch.minor,
                            s.arch.accelerated,
                            s.config.block_m,
                            s.config.block_n,
                            s.config.num_warps,
                            s.config.num_stages};
  return XXH64(fields, sizeof fields, 0);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Mods lower_mods(const Mods& mods) {
  passes::type_check(mods);
  FJ_LOG("pipeline", "typecheck: ok ({})", mods.name);
  Mods m = passes::simplify(mods);
  FJ_LOG("pipeline", "simplify:\n{}", m.to_text());
  m = passes::cse(m);
  FJ_LOG("pipeline", "cse: done");
  return m;
}

cuda::GeneratedSource emit_forward(const Mods& mods, const cuda::ForwardSpec& spec) {
  spec.validate();
  Mods lowered = lower_mods(mods);
  cuda::GeneratedSource src = cuda::generate_forward(lowered, spec);
  FJ_LOG("pipeline", "codegen: {} bytes of CUDA, source key {}", src.source.size(),
         src.source_key.substr(0, 16));
  return src;
}

KernelBuilder::KernelBuilder(jit::CacheSettings settings) : compiler_(std::move(settings)) {}

BuiltKernel KernelBuilder::build_forward(const Mods& mods, const cuda::ForwardSpec& spec) {
  auto t0 = std::chrono::steady_clock::now();
  uint64_t key = mods.hash() * 0x9e3779b97f4a7c15ull ^ spec_hash(spec);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = memo_.find(key);
    if (it != memo_.end()) {
      for (const Entry& e : it->second) {
        if (e.spec == spec && equal(e.mods, mods)) {
          BuiltKernel k = e.kernel;
          k.compiled.outcome = jit::CacheOutcome::MemoryHit;
          k.compiled.elapsed_ms = ms_since(t0);
          return k;
        }
      }
    }
  }
  BuiltKernel k;
  k.source = std::make_shared<const cuda::GeneratedSource>(emit_forward(mods, spec));
  std::string label =
      "forward " + (mods.name.empty() ? std::string("<mods>") : mods.name) + " " + spec.str();
  k.compiled = compile(*k.source, spec.arch.str(), label);
  k.compiled.elapsed_ms = ms_since(t0);
  std::lock_guard<std::mutex> lock(mu_);
  memo_[key].push_back(Entry{mods, spec, k});
  return k;
}

jit::CompileResult KernelBuilder::compile(const cuda::GeneratedSource& source,
                                          const std::string& arch, const std::string& label) {
  jit::CompileRequest req;
  req.source = source.source;
  req.kernel_name = source.kernel_name;
  req.arch = arch;
  req.options = source.options;
  req.label = label;
  jit::CompileResult r = compiler_.compile(req);
  FJ_LOG("pipeline", "compile: {} in {:.1f} ms", label, r.elapsed_ms);
  return r;
}

}  // namespace flexjit
