#include "jit/KernelCompiler.h"

#include "util/Log.h"

#include <flexjit/error.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>

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

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out)
    throw CacheError(fmt::format("cannot write dump file '{}' (FLEXJIT_DUMP_DIR)", path.string()));
}

}  // namespace

KernelCompiler::KernelCompiler(CacheSettings s)
    : settings_(std::move(s)), memory_(settings_.enabled ? settings_.max_memory_entries : 0) {
  if (settings_.enabled) {
    disk_ = std::make_unique<DiskCache>(settings_.dir, settings_.max_disk_bytes);
  }
}

CompileResult KernelCompiler::compile(const CompileRequest& req) {
  auto start = std::chrono::steady_clock::now();
  const std::string key = cache_key(req);
  if (settings_.enabled) {
    if (auto k = memory_.get(key)) {
      return {std::move(k), CacheOutcome::MemoryHit, ms_since(start)};
    }
    if (auto k = disk_->load(key, req.arch)) {
      memory_.put(key, k);
      double ms = ms_since(start);
      FJ_LOG("jit", "loaded {} from the disk cache in {:.2f} ms ({})", req.label, ms,
             k->usage.str());
      return {std::move(k), CacheOutcome::DiskHit, ms};
    }
  }

  std::shared_ptr<CompiledKernel> k;
  try {
    k = std::make_shared<CompiledKernel>(nvrtc_compile(req));
  } catch (const JitError& e) {
    if (!settings_.dump_dir.empty()) {
      try {
        dump(req, key, nullptr, e.what());
      } catch (const CacheError& dump_error) {
        logging::write("jit", fmt::format("warning: {}", dump_error.what()));
      }
    }
    throw;
  }
  k->key = key;
  if (!settings_.dump_dir.empty()) {
    try {
      dump(req, key, k.get(), {});
    } catch (const CacheError& e) {
      logging::write("jit", fmt::format("warning: {}", e.what()));
    }
  }
  if (settings_.enabled) {
    memory_.put(key, k);
    // The kernel is good; a full or read-only disk must not cost the caller it. Say so always:
    // every later process will recompile.
    try {
      disk_->store(*k);
    } catch (const CacheError& e) {
      logging::write("cache", fmt::format("warning: {}", e.what()));
    }
  }
  double ms = ms_since(start);
  FJ_LOG("jit", "compiled {} for {} in {:.0f} ms (cache {}): {}", req.label, req.arch, ms,
         settings_.enabled ? "miss" : "disabled", k->usage.str());
  return {std::move(k), CacheOutcome::Compiled, ms};
}

void KernelCompiler::dump(const CompileRequest& req, const std::string& key,
                          const CompiledKernel* kernel, const std::string& error) const {
  std::error_code ec;
  fs::create_directories(settings_.dump_dir, ec);
  if (ec) {
    throw CacheError(fmt::format("cannot create FLEXJIT_DUMP_DIR '{}': {}",
                                 settings_.dump_dir.string(), ec.message()));
  }
  fs::path base = settings_.dump_dir / (sanitize(req.label) + "-" + key.substr(0, 12));
  write_text(fs::path(base).concat(".cu"), req.source);
  write_text(fs::path(base).concat(".log"), kernel ? kernel->log : error);
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
  write_text(fs::path(base).concat(".json"), j.dump(2) + "\n");
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
