#include "Pipeline.h"

#include "kernels/Registry.h"
#include "passes/CSE.h"
#include "passes/Simplify.h"
#include "passes/TypeCheck.h"
#include "util/Env.h"
#include "util/Log.h"

#include <flexjit/error.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <system_error>
#include <thread>

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
    : compiler_(std::move(settings)), max_memo_(max_memo_entries) {
  compile_threads_ = static_cast<size_t>(env::get_u64("FLEXJIT_COMPILE_THREADS").value_or(0));
}

uint64_t KernelBuilder::memo_key(const Mods& mods, const kernels::KernelDesc& desc) {
  return mods.hash() * 0x9e3779b97f4a7c15ull ^ desc.hash();
}

std::optional<BuiltKernel> KernelBuilder::memo_get(const Mods& mods,
                                                   const kernels::KernelDesc& desc,
                                                   std::chrono::steady_clock::time_point t0) {
  const uint64_t key = memo_key(mods, desc);
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
  return std::nullopt;
}

BuiltKernel KernelBuilder::build_miss(const Mods& mods, const kernels::KernelDesc& desc) {
  auto t0 = std::chrono::steady_clock::now();
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
  const uint64_t key = memo_key(mods, desc);
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

BuiltKernel KernelBuilder::build(const Mods& mods, const kernels::KernelDesc& desc) {
  auto t0 = std::chrono::steady_clock::now();
  if (std::optional<BuiltKernel> hit = memo_get(mods, desc, t0)) return std::move(*hit);
  BuiltKernel k = build_miss(mods, desc);
  std::lock_guard<std::mutex> lock(mu_);
  totals_.kernels += 1;
  totals_.wall_ms += ms_since(t0);
  return k;
}

std::vector<BuiltKernel> KernelBuilder::build_all(const std::vector<BuildRequest>& requests) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<BuiltKernel> out(requests.size());
  std::vector<size_t> misses;
  for (size_t i = 0; i < requests.size(); ++i) {
    FJ_ASSERT(requests[i].mods != nullptr && requests[i].desc != nullptr,
              "build_all: a request without mods or description");
    if (std::optional<BuiltKernel> hit = memo_get(*requests[i].mods, *requests[i].desc, t0)) {
      out[i] = std::move(*hit);
    } else {
      misses.push_back(i);
    }
  }
  if (misses.empty()) return out;
  std::vector<std::exception_ptr> errors(requests.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t m; (m = next.fetch_add(1)) < misses.size();) {
      const size_t i = misses[m];
      try {
        out[i] = build_miss(*requests[i].mods, *requests[i].desc);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  // The calling thread builds too; helpers only where two or more kernels are new.
  const size_t threads = std::min(misses.size(), compile_threads());
  std::vector<std::thread> helpers;
  helpers.reserve(threads - 1);  // before any thread: no reallocation among running ones
  for (size_t t = 1; t < threads; ++t) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no more threads to be had: the ones running (and this one) take the rest
    }
  }
  work();
  for (std::thread& t : helpers)
    t.join();
  const double ms = ms_since(t0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    totals_.kernels += misses.size();
    totals_.concurrent_batches += helpers.empty() ? 0 : 1;
    totals_.wall_ms += ms;
  }
  FJ_LOG("pipeline", "built {} new kernel(s) of {} on {} thread(s) in {:.1f} ms", misses.size(),
         requests.size(), helpers.size() + 1, ms);
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return out;
}

size_t KernelBuilder::compile_threads() const {
  const size_t n = compile_threads_.load(std::memory_order_relaxed);
  return n > 0 ? n : std::max(1u, std::thread::hardware_concurrency());
}

void KernelBuilder::set_compile_threads(size_t threads) {
  compile_threads_.store(threads, std::memory_order_relaxed);
}

BuildTotals KernelBuilder::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
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
