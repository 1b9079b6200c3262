#include "Pipeline.h"

#include "kernels/Registry.h"
#include "passes/CSE.h"
#include "passes/Simplify.h"
#include "passes/TypeCheck.h"
#include "util/Env.h"
#include "util/Log.h"

#include <flexjit/error.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <system_error>
#include <thread>

namespace flexjit {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Every KernelBuilder alive, for stop_all_background. Never destroyed: a builder that outlives
// static destruction (the Python module's contexts are never freed) still finds them.
std::mutex& live_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::unordered_set<KernelBuilder*>& live_builders() {
  static auto* live = new std::unordered_set<KernelBuilder*>;
  return *live;
}

// Once per process, before the first background thread starts: an atexit handler that stops every
// background build before static destruction reaches what the compiles use. Handlers and static
// destructors run in the reverse order of their registration, so the statics of the compile path
// are made first (NVRTC's version query loads it), then the handler registered after them.
void register_exit_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    (void)jit::nvrtc_version();
    std::atexit([] { KernelBuilder::stop_all_background(); });
  });
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
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
  std::lock_guard<std::mutex> lock(live_mutex());
  live_builders().insert(this);
}

KernelBuilder::~KernelBuilder() {
  {
    std::lock_guard<std::mutex> lock(live_mutex());
    live_builders().erase(this);
  }
  halt_background();
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

std::vector<BuiltKernel> KernelBuilder::build_companions(
    const std::vector<kernels::KernelDesc>& descs) {
  std::vector<BuiltKernel> out;
  out.reserve(descs.size());
  const Mods none;
  for (const kernels::KernelDesc& d : descs) {
    if (std::optional<BuiltKernel> hit = memo_get(none, d, std::chrono::steady_clock::now())) {
      out.push_back(std::move(*hit));
    } else {
      out.push_back(build_miss(none, d));
      std::lock_guard<std::mutex> lock(mu_);
      totals_.kernels += 1;
    }
  }
  return out;
}

BuiltKernel KernelBuilder::build_miss(const Mods& mods, const kernels::KernelDesc& desc) {
  auto t0 = std::chrono::steady_clock::now();
  BuiltKernel k;
  k.desc = desc;
  // The companions (no mods shape them: usually memo hits after a process's first build) on a
  // thread of their own while this kernel compiles; errors come back after both are done.
  const std::vector<kernels::KernelDesc> companions = variant_of(desc).companions(desc, mods);
  std::exception_ptr companion_error;
  auto companions_job = [&] {
    try {
      k.companions = build_companions(companions);
    } catch (...) {
      companion_error = std::current_exception();
    }
  };
  std::thread helper;
  if (!companions.empty() && compile_threads() > 1) {
    try {
      helper = std::thread(companions_job);
    } catch (const std::system_error&) {
      // no thread to be had: built below on this one
    }
  }
  std::exception_ptr own_error;
  try {
    k.source = std::make_shared<const cuda::GeneratedSource>(emit_source(mods, desc));
    const std::string label = fmt::format("{} {} {}", desc.family_variant(),
                                          mods.name.empty() ? std::string("<mods>") : mods.name,
                                          desc.str().substr(desc.family_variant().size() + 1));
    k.compiled = compile(*k.source, desc.arch.str(), label);
  } catch (...) {
    own_error = std::current_exception();
  }
  if (helper.joinable()) {
    helper.join();
  } else if (!companions.empty() && !own_error) {
    companions_job();
  }
  if (own_error) std::rethrow_exception(own_error);
  if (companion_error) std::rethrow_exception(companion_error);
  k.compiled.elapsed_ms = ms_since(t0);
  std::lock_guard<std::mutex> lock(mu_);
  if (max_memo_ == 0) return k;
  const uint64_t key = memo_key(mods, desc);
  // Built meanwhile by another thread (a background build, or the same request twice in one
  // batch): the compiler's single flight gave both the one kernel; keep one entry.
  auto [same_lo, same_hi] = memo_.equal_range(key);
  for (auto it = same_lo; it != same_hi; ++it) {
    if (it->second->kernel.desc == desc && equal(it->second->mods, mods)) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return k;
    }
  }
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
  const size_t threads = build_each(requests, misses, compile_threads(), out, errors, nullptr);
  const double ms = ms_since(t0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    totals_.kernels += misses.size();
    totals_.concurrent_batches += threads > 1 ? 1 : 0;
    totals_.wall_ms += ms;
  }
  FJ_LOG("pipeline", "built {} new kernel(s) of {} on {} thread(s) in {:.1f} ms", misses.size(),
         requests.size(), threads, ms);
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return out;
}

size_t KernelBuilder::build_each(const std::vector<BuildRequest>& requests,
                                 const std::vector<size_t>& which, size_t threads,
                                 std::vector<BuiltKernel>& out,
                                 std::vector<std::exception_ptr>& errors,
                                 const std::atomic<bool>* stop) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t m; (stop == nullptr || !stop->load()) && (m = next.fetch_add(1)) < which.size();) {
      const size_t i = which[m];
      try {
        out[i] = build_miss(*requests[i].mods, *requests[i].desc);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  // The calling thread builds too; helpers only where two or more kernels are new.
  threads = std::max<size_t>(1, std::min(which.size(), threads));
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
  return helpers.size() + 1;
}

bool KernelBuilder::background_enabled() const {
  return compiler_.settings().enabled && compile_threads() >= 2 && !bg_stop_.load();
}

size_t KernelBuilder::build_in_background(std::vector<OwnedBuildRequest> requests) {
  if (!background_enabled()) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<OwnedBuildRequest> batch;
  for (OwnedBuildRequest& r : requests) {
    if (!memo_get(r.mods, r.desc, t0)) batch.push_back(std::move(r));
  }
  if (batch.empty()) return 0;
  register_exit_handler();
  std::lock_guard<std::mutex> lock(bg_mu_);
  if (bg_stop_.load()) return 0;
  std::vector<OwnedBuildRequest> queued;
  for (OwnedBuildRequest& r : batch) {
    if (bg_keys_.insert(memo_key(r.mods, r.desc)).second) queued.push_back(std::move(r));
  }
  const size_t n = queued.size();
  if (n == 0) return 0;
  if (!bg_thread_.joinable()) {
    try {
      bg_thread_ = std::thread([this] { background_loop(); });
      bg_pid_ = static_cast<int>(::getpid());
    } catch (const std::system_error& e) {
      for (const OwnedBuildRequest& r : queued)
        bg_keys_.erase(memo_key(r.mods, r.desc));
      FJ_LOG("pipeline", "no background thread ({}): {} kernel(s) left to the calls that need them",
             e.what(), n);
      return 0;
    }
  }
  bg_queue_.push_back(std::move(queued));
  bg_cv_.notify_one();
  FJ_LOG("pipeline", "queued {} kernel(s) to build in the background", n);
  return n;
}

void KernelBuilder::background_loop() {
  std::unique_lock<std::mutex> lock(bg_mu_);
  for (;;) {
    bg_cv_.wait(lock, [&] { return bg_stop_.load() || !bg_queue_.empty(); });
    if (bg_stop_.load()) return;
    std::vector<OwnedBuildRequest> batch = std::move(bg_queue_.front());
    bg_queue_.pop_front();
    bg_busy_ = true;
    lock.unlock();
    // Nothing may escape this thread: every failure is the kernel's own, logged and dropped.
    try {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<BuildRequest> requests;
      requests.reserve(batch.size());
      std::vector<size_t> misses;
      for (const OwnedBuildRequest& r : batch) {
        // Built meanwhile by the call that needed it: nothing left to do.
        if (!memo_get(r.mods, r.desc, t0)) misses.push_back(requests.size());
        requests.push_back({&r.mods, &r.desc});
      }
      std::vector<BuiltKernel> out(requests.size());
      std::vector<std::exception_ptr> errors(requests.size());
      // One thread fewer than build_all may use: the caller's own compiles keep one.
      const size_t threads =
          build_each(requests, misses, compile_threads() - 1, out, errors, &bg_stop_);
      uint64_t done = 0;
      for (size_t i : misses) {
        if (errors[i]) {
          FJ_LOG("pipeline",
                 "background build of {} failed (the call that needs it builds it again and "
                 "reports the error): {}",
                 requests[i].desc->str(), what_of(errors[i]));
        }
        done += (errors[i] || out[i].compiled.kernel) ? 1 : 0;
      }
      {
        std::lock_guard<std::mutex> totals_lock(mu_);
        totals_.background_kernels += done;
      }
      FJ_LOG("pipeline", "built {} kernel(s) in the background on {} thread(s) in {:.1f} ms", done,
             threads, ms_since(t0));
    } catch (const std::exception& e) {
      FJ_LOG("pipeline", "background build stopped: {}", e.what());
    } catch (...) {
      FJ_LOG("pipeline", "background build stopped by an exception that is not a std::exception");
    }
    lock.lock();
    for (const OwnedBuildRequest& r : batch)
      bg_keys_.erase(memo_key(r.mods, r.desc));
    bg_busy_ = false;
    bg_idle_.notify_all();
  }
}

void KernelBuilder::wait_background() {
  std::unique_lock<std::mutex> lock(bg_mu_);
  bg_idle_.wait(lock, [&] { return bg_queue_.empty() && !bg_busy_; });
}

void KernelBuilder::stop_background() {
  halt_background();
}

void KernelBuilder::halt_background() {
  std::lock_guard<std::mutex> join_lock(bg_join_mu_);
  {
    std::lock_guard<std::mutex> lock(bg_mu_);
    bg_stop_.store(true);
    for (const std::vector<OwnedBuildRequest>& batch : bg_queue_) {
      for (const OwnedBuildRequest& r : batch)
        bg_keys_.erase(memo_key(r.mods, r.desc));
    }
    bg_queue_.clear();
  }
  bg_cv_.notify_all();
  bg_idle_.notify_all();
  if (!bg_thread_.joinable()) return;
  if (bg_pid_ != static_cast<int>(::getpid())) {
    // A forked child: the thread was the parent's and does not run here. Destroying a joinable
    // std::thread terminates and joining it waits forever: its handle is left behind.
    new std::thread(std::move(bg_thread_));
    return;
  }
  bg_thread_.join();
}

void KernelBuilder::stop_all_background() {
  std::lock_guard<std::mutex> lock(live_mutex());
  for (KernelBuilder* b : live_builders())
    b->halt_background();
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
