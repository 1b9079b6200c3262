#include "jit/KernelCompiler.h"

#include "util/Log.h"
#include "util/PrivateFiles.h"

#include <flexjit/error.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <chrono>

namespace flexjit::jit {

namespace fs = std::filesystem;

const char* to_string(CacheOutcome o) {
  switch (o) {
    case CacheOutcome::Compiled:
      return "compiled";
    case CacheOutcome::MemoryHit:
      return "memory hit";
    case CacheOutcome::DiskHit:
      return "disk hit";
  }
  return "?";
}

namespace {

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// "forward alibi bf16 d128" -> "forward_alibi_bf16_d128": safe in a file name.
std::string sanitize(const std::string& label) {
  std::string out;
  for (char c : label) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    out += ok ? c : '_';
  }
  if (out.empty()) out = "kernel";
  return out.substr(0, 80);
}

}  // namespace

KernelCompiler::KernelCompiler(CacheSettings s)
    : settings_(std::move(s)), memory_(settings_.enabled ? settings_.max_memory_entries : 0) {
  if (!settings_.enabled) return;
  disk_ = std::make_unique<DiskCache>(settings_.dir, settings_.max_disk_bytes);
  if (!disk_->trusted()) {
    disk_problem_ = disk_->problem();
    disk_.reset();
    files::warn_once("cache", disk_problem_ + ". flexjit compiles without the disk cache.");
  }
}

CompileResult KernelCompiler::compile(const CompileRequest& req) {
  auto start = std::chrono::steady_clock::now();
  const std::string key = cache_key(req);
  if (!settings_.enabled) {
    auto k = run_nvrtc(req, key);
    double ms = ms_since(start);
    FJ_LOG("jit", "compiled {} for {} in {:.0f} ms (cache disabled): {}", req.label, req.arch, ms,
           k->usage.str());
    return {std::move(k), CacheOutcome::Compiled, ms};
  }
  if (auto k = memory_.get(key)) {
    return {std::move(k), CacheOutcome::MemoryHit, ms_since(start)};
  }
  // Single flight: the first thread to miss compiles; the others wait for its kernel or error.
  std::promise<std::shared_ptr<const CompiledKernel>> mine;
  SharedKernel theirs;
  {
    std::lock_guard<std::mutex> lock(inflight_mutex_);
    auto it = inflight_.find(key);
    if (it != inflight_.end()) {
      theirs = it->second;
    } else {
      inflight_.emplace(key, mine.get_future().share());
    }
  }
  if (theirs.valid()) {
    std::shared_ptr<const CompiledKernel> k = theirs.get();  // rethrows the compiler's error
    return {std::move(k), CacheOutcome::MemoryHit, ms_since(start)};
  }
  auto finish = [&] {
    std::lock_guard<std::mutex> lock(inflight_mutex_);
    inflight_.erase(key);
  };
  try {
    CompileResult r = compile_once(req, key, start);
    finish();  // after memory_.put: a thread that misses the in-flight entry hits memory
    mine.set_value(r.kernel);
    return r;
  } catch (...) {
    finish();
    mine.set_exception(std::current_exception());
    throw;
  }
}

CompileResult KernelCompiler::compile_once(const CompileRequest& req, const std::string& key,
                                           std::chrono::steady_clock::time_point start) {
  // Another thread may have finished this key between our memory miss and taking the flight.
  if (auto k = memory_.get(key)) {
    return {std::move(k), CacheOutcome::MemoryHit, ms_since(start)};
  }
  auto disk_hit = [&](std::shared_ptr<const CompiledKernel> k) {
    memory_.put(key, k);
    double ms = ms_since(start);
    FJ_LOG("jit", "loaded {} from the disk cache in {:.2f} ms ({})", req.label, ms, k->usage.str());
    return CompileResult{std::move(k), CacheOutcome::DiskHit, ms};
  };
  KeyLock lock;
  if (disk_) {
    if (auto k = disk_->load(key, req.arch)) return disk_hit(std::move(k));
    // Another process may be compiling this key: wait for it, then look again (jitify2's
    // "check again under the lock").
    lock = disk_->lock(key, settings_.lock_wait);
    if (lock.held()) {
      if (auto k = disk_->load(key, req.arch)) return disk_hit(std::move(k));
    }
  }
  std::shared_ptr<CompiledKernel> k = run_nvrtc(req, key);
  memory_.put(key, k);
  if (disk_) store(*k);
  lock.release();  // after the entry is in place
  double ms = ms_since(start);
  FJ_LOG("jit", "compiled {} for {} in {:.0f} ms (cache miss): {}", req.label, req.arch, ms,
         k->usage.str());
  return {std::move(k), CacheOutcome::Compiled, ms};
}

std::shared_ptr<CompiledKernel> KernelCompiler::run_nvrtc(const CompileRequest& req,
                                                          const std::string& key) {
  auto try_dump = [&](const CompiledKernel* kernel, const std::string& error) {
    if (settings_.dump_dir.empty()) return;
    try {
      dump(req, key, kernel, error);
    } catch (const CacheError& e) {
      files::warn_once("jit", e.what());
    }
  };
  std::shared_ptr<CompiledKernel> k;
  try {
    k = std::make_shared<CompiledKernel>(nvrtc_compile(req));
  } catch (const JitError& e) {
    try_dump(nullptr, e.what());
    throw;
  }
  k->key = key;
  try_dump(k.get(), {});
  return k;
}

void KernelCompiler::store(const CompiledKernel& k) {
  if (disk_->read_only()) {
    files::warn_once("cache", disk_->problem() +
                                  ": its kernels are used, new ones are not stored (every "
                                  "process compiles them again)");
    return;
  }
  // The kernel is good; a full disk must not cost the caller it. Say so always: every later
  // process will recompile.
  try {
    disk_->store(k);
  } catch (const CacheError& e) {
    logging::write("cache", fmt::format("warning: {}", e.what()));
  }
}

void KernelCompiler::dump(const CompileRequest& req, const std::string& key,
                          const CompiledKernel* kernel, const std::string& error) const {
  // Dumps hold generated source and logs: private, like the cache.
  files::DirCheck dir = files::open_private_dir(settings_.dump_dir, "FLEXJIT_DUMP_DIR");
  if (dir.state != files::DirState::Writable) {
    throw CacheError(dir.problem + "; nothing is dumped");
  }
  fs::path base = settings_.dump_dir / (sanitize(req.label) + "-" + key.substr(0, 12));
  files::write_private_file(fs::path(base).concat(".cu"), req.source);
  files::write_private_file(fs::path(base).concat(".log"), kernel ? kernel->log : error);
  nlohmann::json j;
  if (kernel) j = nlohmann::json::parse(kernel_metadata_json(*kernel));
  j["key"] = key;
  j["label"] = req.label;
  j["arch"] = req.arch;
  j["kernel_name"] = req.kernel_name;
  j["options"] = nvrtc_options(req);
  j["ok"] = kernel != nullptr;
  if (!kernel) j["error"] = error;
  j.erase("log");  // in the .log file
  files::write_private_file(fs::path(base).concat(".json"), j.dump(2) + "\n");
  FJ_LOG("jit", "dumped {}.{{cu,log,json}}", base.string());
}

DiskCache* KernelCompiler::disk() {
  return disk_.get();
}

void KernelCompiler::clear_memory() {
  memory_.clear();
}

const CacheSettings& KernelCompiler::settings() const {
  return settings_;
}

}  // namespace flexjit::jit
