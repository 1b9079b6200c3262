#include "Pipeline.h"

#include "kernels/Registry.h"
#include "passes/CSE.h"
#include "passes/Simplify.h"
#include "passes/TypeCheck.h"
#include "util/Log.h"

#include <chrono>

namespace flexjit {

namespace {

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

const kernels::Variant& variant_of(const kernels::KernelDesc& desc) {
  return kernels::Registry::global().get(desc.family, desc.variant);
}

cuda::GeneratedSource emit_source(const Mods& mods, const kernels::KernelDesc& desc) {
  const kernels::Variant& variant = variant_of(desc);
  variant.validate(desc);
  Mods lowered = lower_mods(variant.kernel_mods(mods));
  cuda::GeneratedSource src = variant.generate(lowered, desc);
  FJ_LOG("pipeline", "codegen: {}: {} bytes of CUDA, source key {}", desc.str(), src.source.size(),
         src.source_key.substr(0, 16));
  return src;
}

KernelBuilder::KernelBuilder(jit::CacheSettings settings, size_t max_memo_entries)
    : compiler_(std::move(settings)), max_memo_(max_memo_entries) {}

BuiltKernel KernelBuilder::build(const Mods& mods, const kernels::KernelDesc& desc) {
  auto t0 = std::chrono::steady_clock::now();
  const uint64_t key = mods.hash() * 0x9e3779b97f4a7c15ull ^ desc.hash();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto [lo, hi] = memo_.equal_range(key);
    for (auto it = lo; it != hi; ++it) {
      const Entry& e = *it->second;
      // operator== covers every field of the description, the hash only its text.
      if (e.kernel.desc == desc && equal(e.mods, mods)) {
        lru_.splice(lru_.begin(), lru_, it->second);
        BuiltKernel k = e.kernel;
        k.compiled.outcome = jit::CacheOutcome::MemoryHit;
        k.compiled.elapsed_ms = ms_since(t0);
        return k;
      }
    }
  }
  BuiltKernel k;
  k.desc = desc;
  k.source = std::make_shared<const cuda::GeneratedSource>(emit_source(mods, desc));
  const std::string label = fmt::format("{} {} {}", desc.family_variant(),
                                        mods.name.empty() ? std::string("<mods>") : mods.name,
                                        desc.str().substr(desc.family_variant().size() + 1));
  k.compiled = compile(*k.source, desc.arch.str(), label);
  k.compiled.elapsed_ms = ms_since(t0);
  std::lock_guard<std::mutex> lock(mu_);
  if (max_memo_ == 0) return k;
  lru_.push_front(Entry{key, mods, k});
  memo_.emplace(key, lru_.begin());
  while (lru_.size() > max_memo_) {
    auto last = std::prev(lru_.end());
    auto [lo, hi] = memo_.equal_range(last->key);
    for (auto it = lo; it != hi; ++it) {
      if (it->second == last) {
        memo_.erase(it);
        break;
      }
    }
    lru_.pop_back();
  }
  return k;
}

size_t KernelBuilder::memo_size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
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
