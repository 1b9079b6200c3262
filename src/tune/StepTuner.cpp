#include "tune/StepTuner.h"

#include <flexjit/error.h>

#include "binding/AttentionCall.h"
#include "device/CudaDriver.h"
#include "device/Timer.h"
#include "ir/Evaluate.h"
#include "kernels/Registry.h"
#include "plan/Plan.h"
#include "tune/Prune.h"
#include "tune/ThreadPool.h"
#include "tune/TuningStore.h"
#include "util/Env.h"
#include "util/Log.h"
#include "util/PrivateFiles.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace flexjit::tune {

namespace {

std::atomic<uint64_t> g_searches{0};

std::string first_line(const std::string& s) {
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

double bits_to_double(DType dt, const char* p) {
  switch (dt) {
    case DType::F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      const uint32_t u = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
      double v;
      if (exp == 0)
        v = std::ldexp(mant, -24);
      else if (exp == 31)
        v = mant ? std::numeric_limits<double>::quiet_NaN()
                 : std::numeric_limits<double>::infinity();
      else
        v = std::ldexp(mant + 1024, exp - 25);
      return sign ? -v : v;
    }
    case DType::I32: {
      int32_t i;
      std::memcpy(&i, p, 4);
      return i;
    }
    case DType::Bool:
      return *p != 0 ? 1 : 0;
    case DType::E4M3:
      return ir::e4m3_bits_to_float(static_cast<uint8_t>(*p));
  }
  return 0;
}

// The elements of a device tensor (any strides), in C order, widened to double.
std::vector<double> read_tensor(const TensorRef& t) {
  const int es = dtype_size(t.dtype);
  int64_t n = 1, span = 1;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    n *= t.shape[d];
    if (t.shape[d] == 0) return {};
    span += (t.shape[d] - 1) * t.strides[d];
  }
  std::string bytes(static_cast<size_t>(span) * es, '\0');
  FJ_CU(cuMemcpyDtoH, "a tuning output", bytes.data(), reinterpret_cast<CUdeviceptr>(t.data),
        bytes.size());
  std::vector<double> out;
  out.reserve(static_cast<size_t>(n));
  std::vector<int64_t> idx(t.shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d)
      off += idx[d] * t.strides[d];
    out.push_back(bits_to_double(t.dtype, bytes.data() + off * es));
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

runtime::CuStream as_stream(void* s) {
  return static_cast<runtime::CuStream>(s);
}

DeviceIdentity identity_of(const runtime::Device& d) {
  return {d.name(), d.cc_major(), d.cc_minor(), d.sm_count()};
}

// Whether `variant` has more than one config for `keyed` (else there is nothing to tune).
// Memoized per description: config_space validates every combination, and the invalid ones
// throw, which costs hundreds of microseconds per call for decode_split's 243 combinations —
// more than the decode kernel itself, on every call of a tuned plan.
bool has_choices(const kernels::Variant& variant, const kernels::KernelDesc& keyed) {
  static std::mutex mu;
  static auto* memo = new std::unordered_map<std::string, bool>();
  const std::string text = keyed.str();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = memo->find(text); it != memo->end()) return it->second;
  }
  const bool choices = variant.config_space(keyed).size() > 1;
  std::lock_guard<std::mutex> lock(mu);
  if (memo->size() >= 4096) memo->clear();
  memo->emplace(text, choices);
  return choices;
}

// True the first time this process uses the stored winner of `key` (FLEXJIT_PRINT_AUTOTUNING
// prints it once, not on every call).
bool first_use(const TuningKey& key) {
  static std::mutex mu;
  static auto* seen = new std::unordered_set<std::string>();
  std::lock_guard<std::mutex> lock(mu);
  return seen->insert(key.str()).second;
}

// The store of the context's cache directory; in memory when the disk cache is off or untrusted.
TuningStore& store_of(ContextImpl& ctx) {
  jit::KernelCompiler& c = ctx.builder.compiler();
  return TuningStore::for_cache_dir(c.disk() != nullptr ? c.settings().dir
                                                        : std::filesystem::path());
}

std::string config_text(const kernels::Params& p) {
  return p.str();
}

void print_record(const TuningRecord& r, double seconds) {
  std::string s = fmt::format(
      "flexjit autotune: {} [{}] on {} ({} candidates, {} pruned, {:.1f} s)\n", r.key.kernel,
      r.key.bucket, r.key.device.str(), r.candidates.size(), r.pruned.size(), seconds);
  for (const CandidateTiming& c : r.candidates) {
    const bool is_default = c.config == r.default_config;
    if (c.median_ms >= 0) {
      s += fmt::format("  {:<52} {:>9.4f} ms{}{}\n", config_text(c.config), c.median_ms,
                       is_default ? "  (default)" : "", c.config == r.config ? "  <- winner" : "");
    } else {
      s += fmt::format("  {:<52} {}{}\n", config_text(c.config), c.status,
                       is_default ? "  (default)" : "");
    }
  }
  for (const auto& [config, reason] : r.pruned)
    s += fmt::format("  {:<52} pruned: {}\n", config_text(config), reason);
  s += fmt::format("  winner: {} {:.4f} ms (default {:.4f} ms, {:.2f}x)\n", config_text(r.config),
                   r.time_ms, r.default_ms, r.time_ms > 0 ? r.default_ms / r.time_ms : 0.0);
  std::fputs(s.c_str(), stderr);
}

struct Candidate {
  kernels::Params config;
  kernels::KernelDesc desc;
  std::optional<BuiltKernel> built;
  std::vector<CompanionStep> after;  // StepTuning::after for this config
  std::vector<BuiltKernel> after_built;
  std::string status = "ok";
  double median_ms = -1;
};

// Launches one step's kernel on explicit workspace pointers (bound by `launches`).
void launch_step(runtime::Device& device, const kernels::KernelDesc& desc, const Mods& mods,
                 const BuiltKernel& built, std::vector<kernels::Launch> launches,
                 runtime::CuStream stream) {
  runtime::Plan plan;
  runtime::PlanStep step;
  step.desc = desc;
  step.mods = mods;
  auto shared = std::make_shared<std::vector<kernels::Launch>>(std::move(launches));
  step.launches = [shared](void*) { return std::move(*shared); };
  plan.add(std::move(step));
  runtime::BuiltPlan bp;
  bp.kernels.push_back(built);
  runtime::launch_plan(device, plan, bp, stream, Workspace{});
}

size_t aligned(size_t n) {
  return (n + 255) / 256 * 256;
}

// What a search found: its record (winner and all timings) and the winner's description, as
// the registry completed it for the candidate.
struct SearchResult {
  TuningRecord record;
  kernels::KernelDesc winner;
};

// Times every candidate config of the variant `selection` chose, each completed once with it.
std::optional<SearchResult> search(const StepTuning& tuning, const kernels::KernelDesc& problem,
                                   const TuningKey& key, const kernels::InputFacts& facts,
                                   const Mods& mods, const kernels::Params& caller,
                                   const kernels::Selection& selection, const runtime::StepIo& io) {
  ContextImpl& ctx = *tuning.ctx;
  runtime::Device& device = *ctx.device;
  const kernels::Registry& reg = kernels::Registry::global();
  const kernels::Variant& variant = *selection.variant;
  kernels::KernelDesc keyed = problem;
  keyed.variant = std::string(variant.name());
  const CandidateSet set =
      prune_configs(variant, keyed, facts, caller, device.max_shared_memory_optin());
  for (const PrunedConfig& p : set.pruned)
    FJ_LOG("tune", "pruned {} for {}: {}", p.config.str(), key.kernel, p.reason);

  std::vector<Candidate> cands;
  std::vector<PrunedConfig> too_large;  // for the caller's workspace
  for (const kernels::Params& c : set.candidates) {
    Candidate cand;
    cand.config = c;
    try {
      cand.desc = reg.resolve(selection, problem, facts, runtime::below(caller, c));
      const size_t need = aligned(io.workspace_bytes(cand.desc));
      if (tuning.workspace_limit > 0 && need > tuning.workspace_limit && !cands.empty()) {
        too_large.push_back({c, fmt::format("needs {} bytes of workspace; the call gives {}", need,
                                            tuning.workspace_limit)});
        continue;
      }
      if (tuning.after) cand.after = tuning.after(cand.desc);
    } catch (const UnsupportedError& e) {
      cand.status = fmt::format("unsupported: {}", first_line(e.what()));
    }
    cands.push_back(std::move(cand));
  }
  for (const PrunedConfig& p : too_large)
    FJ_LOG("tune", "pruned {} for {}: {}", p.config.str(), key.kernel, p.reason);
  // The step whose workspace the candidates read: built once (a failure here is the call's own).
  std::optional<BuiltKernel> before_built;
  if (tuning.before) {
    try {
      before_built = ctx.builder.build(tuning.before->mods, tuning.before->desc);
    } catch (const Error& e) {
      FJ_LOG("tune", "no search for {}: the step before it does not build: {}", key.kernel,
             first_line(e.what()));
      return std::nullopt;
    }
  }
  // Compile in parallel through the context's builder (memo, memory and disk caches, NVRTC).
  {
    ThreadPool pool(
        std::min<size_t>(cands.size(), std::max(1u, std::thread::hardware_concurrency())));
    parallel_for(pool, cands.size(), [&](size_t i) {
      Candidate& c = cands[i];
      if (c.status != "ok") return;
      try {
        c.built = ctx.builder.build(mods, c.desc);
        for (const CompanionStep& a : c.after)
          c.after_built.push_back(ctx.builder.build(a.mods, a.desc));
      } catch (const Error& e) {
        c.status = fmt::format("compile failed: {}", first_line(e.what()));
      }
    });
  }
  device.make_current();  // compiles need no context; the launches below do
  if (cands.empty() || cands[0].status != "ok") {
    // The default does not build: the call fails the same way untuned, with the full message.
    FJ_LOG("tune", "no search for {}: the default config does not build", key.kernel);
    return std::nullopt;
  }

  // Scratch: the earlier step's slice (the candidates launch on it), else the candidates' own.
  size_t own_bytes = 0;
  for (const Candidate& c : cands) {
    if (c.status == "ok") own_bytes = std::max(own_bytes, io.workspace_bytes(c.desc));
  }
  const size_t before_bytes = tuning.before ? aligned(tuning.before->workspace_bytes) : 0;
  runtime::DeviceBuffer scratch(device, before_bytes + own_bytes);
  char* const base = static_cast<char*>(scratch.data());
  void* const before_ws = tuning.before && tuning.before->workspace_bytes > 0 ? base : nullptr;
  void* const own_ws = own_bytes > 0 ? base + before_bytes : nullptr;
  const runtime::CuStream stream = tuning.stream;
  // What every run starts from: accumulated outputs zeroed, the earlier step's workspace made.
  auto prepare = [&] {
    for (const TensorRef& t : io.accumulated)
      runtime::zero_fill(t, static_cast<CUstream>(stream));
    if (tuning.before) {
      launch_step(device, tuning.before->desc, tuning.before->mods, *before_built,
                  tuning.before->launches(before_ws), stream);
    }
  };
  auto run = [&](const Candidate& c) {
    void* ws = tuning.before ? before_ws : own_ws;
    launch_step(device, c.desc, mods, *c.built, io.launches(c.desc, ws), stream);
    for (size_t a = 0; a < c.after.size(); ++a) {
      FJ_ASSERT(c.after[a].workspace_bytes == 0, "a step after a tuned one has its own workspace");
      launch_step(device, c.after[a].desc, c.after[a].mods, c.after_built[a],
                  c.after[a].launches(ws), stream);
    }
  };
  auto sync = [&] { FJ_CU(cuStreamSynchronize, "the tuning stream", stream); };
  auto read_outputs = [&] {
    std::vector<std::vector<double>> v;
    for (const TensorRef& t : io.outputs)
      v.push_back(read_tensor(t));
    return v;
  };

  // The default's outputs are the reference; a launch error there is the call's own error.
  prepare();
  run(cands[0]);
  sync();
  const std::vector<std::vector<double>> reference = read_outputs();
  if (io.outputs.empty())
    FJ_LOG("tune", "{}: outputs not compared (the family names none)", key.kernel);
  for (size_t i = 1; i < cands.size(); ++i) {
    Candidate& c = cands[i];
    if (c.status != "ok") continue;
    try {
      prepare();
      run(c);
      sync();
      const std::vector<std::vector<double>> got = read_outputs();
      for (size_t o = 0; o < got.size(); ++o) {
        std::string why = compare_outputs(io.outputs[o].dtype, reference[o], got[o]);
        if (!why.empty()) {
          c.status = fmt::format("wrong output {}: {}", o, why);
          break;
        }
      }
    } catch (const Error& e) {
      c.status = fmt::format("launch failed: {}", first_line(e.what()));
    }
  }
  runtime::DeviceTimer timer(device, stream);
  runtime::TimingOptions opts;
  opts.warmup_ms = 5;
  opts.repeat_ms = 40;
  opts.min_repeats = 5;
  opts.max_repeats = 200;
  if (!io.accumulated.empty() || tuning.before) opts.before_each = prepare;
  for (Candidate& c : cands) {
    if (c.status != "ok") continue;
    try {
      c.median_ms = timer.time([&] { run(c); }, opts).median_ms;
    } catch (const Error& e) {
      c.status = fmt::format("launch failed: {}", first_line(e.what()));
    }
  }
  // Leave the accumulated outputs as the call's own launch expects them: zero.
  for (const TensorRef& t : io.accumulated)
    runtime::zero_fill(t, static_cast<CUstream>(stream));
  if (cands[0].median_ms < 0) return std::nullopt;  // the default itself failed to time

  TuningRecord rec;
  rec.key = key;
  rec.default_config = cands[0].config;
  rec.default_ms = cands[0].median_ms;
  size_t best = 0;
  for (size_t i = 0; i < cands.size(); ++i) {
    const Candidate& c = cands[i];
    rec.candidates.push_back({c.config, c.median_ms, c.status});
    if (c.median_ms >= 0 && c.median_ms < cands[best].median_ms) best = i;
  }
  rec.config = cands[best].config;
  rec.time_ms = cands[best].median_ms;
  for (const PrunedConfig& p : set.pruned)
    rec.pruned.emplace_back(p.config, p.reason);
  for (const PrunedConfig& p : too_large)
    rec.pruned.emplace_back(p.config, p.reason);
  return SearchResult{std::move(rec), std::move(cands[best].desc)};
}

}  // namespace

uint64_t search_count() {
  return g_searches.load(std::memory_order_relaxed);
}

const char* to_string(Mode m) {
  switch (m) {
    case Mode::Off:
      return "off";
    case Mode::Cached:
      return "cached";
    case Mode::Search:
      return "search";
  }
  return "off";
}

std::optional<Mode> parse_mode(std::string_view s) {
  std::string l(s);
  for (char& c : l)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (l == "off") return Mode::Off;
  if (l == "cached") return Mode::Cached;
  if (l == "search") return Mode::Search;
  return std::nullopt;
}

Mode resolve_mode(AutotuneMode m) {
  switch (m) {
    case AutotuneMode::Off:
      return Mode::Off;
    case AutotuneMode::Cached:
      return Mode::Cached;
    case AutotuneMode::Search:
      return Mode::Search;
    case AutotuneMode::FromEnv:
      break;
  }
  const auto v = env::get("FLEXJIT_AUTOTUNE");
  if (!v) return Mode::Off;
  if (auto mode = parse_mode(*v)) return *mode;
  files::warn_once("tune", fmt::format("FLEXJIT_AUTOTUNE='{}' is not one of off, cached, search; "
                                       "autotuning is off",
                                       *v));
  return Mode::Off;
}

bool print_enabled() {
  return env::flag("FLEXJIT_PRINT_AUTOTUNING");
}

StepTuning step_tuning(Context& ctx, AutotuneMode mode, void* stream) {
  StepTuning t;
  t.ctx = &impl_of(ctx);
  t.mode = resolve_mode(mode);
  t.stream = as_stream(stream);
  return t;
}

runtime::CompletedStep StepTuning::complete(const kernels::KernelDesc& problem,
                                            const kernels::InputFacts& facts, const Mods& mods,
                                            const kernels::Params& caller, std::string_view forced,
                                            const runtime::StepIo& io) const {
  return complete_step(*this, problem, facts, mods, caller, forced, io);
}

StepTuning lookup_only(StepTuning tuning) {
  if (tuning.mode == Mode::Search) tuning.mode = Mode::Cached;
  return tuning;
}

std::string compare_outputs(DType dtype, const std::vector<double>& reference,
                            const std::vector<double>& candidate) {
  if (reference.size() != candidate.size()) {
    return fmt::format("{} elements vs {}", candidate.size(), reference.size());
  }
  double atol = 2e-3, rtol = 2e-3;
  if (dtype == DType::BF16) atol = rtol = 2e-2;
  if (dtype == DType::F16) atol = rtol = 5e-3;
  if (dtype == DType::I32 || dtype == DType::Bool) atol = rtol = 0;  // indices: exact
  for (size_t i = 0; i < reference.size(); ++i) {
    const double r = reference[i], c = candidate[i];
    if (!std::isfinite(r) || !std::isfinite(c)) {
      const bool same = (std::isnan(r) && std::isnan(c)) || r == c;
      if (!same) return fmt::format("element {}: {} vs {}", i, c, r);
      continue;
    }
    const double tol = atol + rtol * std::abs(r);
    if (std::abs(c - r) > tol) {
      return fmt::format("element {}: {} vs {} (tolerance {:.3g})", i, c, r, tol);
    }
  }
  return {};
}

runtime::CompletedStep complete_step(const StepTuning& tuning, const kernels::KernelDesc& problem,
                                     const kernels::InputFacts& facts, const Mods& mods,
                                     const kernels::Params& caller, std::string_view forced,
                                     const runtime::StepIo& io) {
  const kernels::Registry& reg = kernels::Registry::global();
  runtime::CompletedStep step;
  // The caller's overrides select the variant: a variant without a key the caller set is passed
  // over. Tuned values are that variant's own keys, so they never change the choice.
  step.selection = reg.select(problem, facts, forced, caller);
  // The step with `tuned` below the caller's values: the registry's one completion of it.
  auto completed = [&](const kernels::Params& tuned) {
    step.desc = reg.resolve(step.selection, problem, facts, runtime::below(caller, tuned));
    return std::move(step);
  };
  if (!tuning.active()) return completed({});
  const kernels::Variant& variant = *step.selection.variant;
  kernels::KernelDesc keyed = problem;
  keyed.variant = std::string(variant.name());
  if (!has_choices(variant, keyed)) return completed({});  // nothing to choose
  TuningKey key = make_key(identity_of(*tuning.ctx->device), keyed, mods.hash(), facts, caller);
  if (!tuning.bucket_extra.empty()) key.bucket += " " + tuning.bucket_extra;
  TuningStore& store = store_of(*tuning.ctx);
  if (auto rec = store.find(key)) {
    std::optional<kernels::KernelDesc> stored;
    size_t need = 0;
    try {
      stored = reg.resolve(step.selection, problem, facts, runtime::below(caller, rec->config));
      need = io.workspace_bytes(*stored);
    } catch (const UnsupportedError& e) {
      files::warn_once(
          "tune", fmt::format("the stored tuned config {} for {} [{}] is not valid any more "
                              "({}); {}",
                              rec->config.str(), key.kernel, key.bucket, first_line(e.what()),
                              tuning.mode == Mode::Search ? "retuning" : "using the defaults"));
    }
    if (stored) {
      if (tuning.workspace_limit > 0 && aligned(need) > tuning.workspace_limit) {
        FJ_LOG("tune",
               "the stored tuned config {} for {} [{}] needs {} bytes of workspace; the call "
               "gives {}: defaults",
               rec->config.str(), key.kernel, key.bucket, need, tuning.workspace_limit);
        return completed({});
      }
      FJ_LOG("tune", "tuned config {} for {} [{}]", rec->config.str(), key.kernel, key.bucket);
      if (print_enabled() && first_use(key)) {
        std::fprintf(stderr, "flexjit autotune: %s [%s]: stored winner %s (%.4f ms)\n",
                     key.kernel.c_str(), key.bucket.c_str(), rec->config.str().c_str(),
                     rec->time_ms);
      }
      step.desc = std::move(*stored);
      return step;
    }
  }
  if (tuning.mode != Mode::Search) {
    FJ_LOG("tune", "no tuned config for {} [{}]: defaults", key.kernel, key.bucket);
    return completed({});
  }
  const auto t0 = std::chrono::steady_clock::now();
  g_searches.fetch_add(1, std::memory_order_relaxed);
  std::optional<SearchResult> found =
      search(tuning, problem, key, facts, mods, caller, step.selection, io);
  if (!found) return completed({});
  const TuningRecord& rec = found->record;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  FJ_LOG("tune", "searched {} [{}]: {} ({:.4f} ms; default {:.4f} ms) in {:.1f} s", key.kernel,
         key.bucket, rec.config.str(), rec.time_ms, rec.default_ms, seconds);
  if (print_enabled()) print_record(rec, seconds);
  store.put(rec);
  step.desc = std::move(found->winner);  // the winning candidate's own completion
  return step;
}

}  // namespace flexjit::tune
