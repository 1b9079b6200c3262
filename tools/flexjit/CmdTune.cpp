// flexjit tune --manifest FILE: warm the kernel cache (any machine) and the tuning table (with a
// GPU) for the workloads of a deployment. docs/tuning.md describes the manifest and the run.
#include <flexjit/attention.h>
#include <flexjit/backward.h>
#include <flexjit/context.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/device_tensor.h>
#include <flexjit/error.h>
#include <flexjit/paged_kv.h>

#include "Pipeline.h"
#include "device/Device.h"
#include "flexjit/BenchCases.h"
#include "flexjit/Commands.h"
#include "ir/IR.h"
#include "jit/CacheSettings.h"
#include "tune/Manifest.h"
#include "tune/StepTuner.h"
#include "tune/ThreadPool.h"
#include "tune/TuningStore.h"
#include "util/CheckedMath.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <sstream>
#include <string_view>

namespace flexjit::cli {

namespace {

struct TuneArgs {
  std::string manifest;
  std::vector<std::string> archs;
  int jobs = 0;
  bool all_configs = false;
  bool json = false;
  bool dry_run = false;
  bool no_time = false;
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Progress on stderr: a bar redrawn in place on a terminal, one line per item otherwise.
class Progress {
 public:
  Progress(size_t total, bool quiet)
      : total_(total),
        tty_(!quiet && isatty(fileno(stderr)) != 0),
        quiet_(quiet),
        start_(Clock::now()) {}
  void step(const std::string& what, const std::string& outcome) {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    ++counts_[outcome];
    if (quiet_) return;
    const double el = seconds_since(start_);
    if (tty_) {
      constexpr int kWidth = 30;
      const int filled = total_ ? static_cast<int>(kWidth * done_ / total_) : kWidth;
      std::fprintf(stderr, "\r[%s%s] %zu/%zu  compiled %zu  cached %zu  failed %zu  %02d:%02d ",
                   std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                   done_, total_, counts_["compiled"], counts_["cached"], counts_["failed"],
                   static_cast<int>(el) / 60, static_cast<int>(el) % 60);
      if (done_ == total_) std::fputc('\n', stderr);
    } else {
      std::fprintf(stderr, "[%zu/%zu %.1fs] %s %s\n", done_, total_, el, outcome.c_str(),
                   what.c_str());
    }
    std::fflush(stderr);
  }

 private:
  std::mutex mu_;
  size_t total_, done_ = 0;
  bool tty_, quiet_;
  Clock::time_point start_;
  std::map<std::string, size_t> counts_;
};

std::vector<std::string> split_archs(const std::vector<std::string>& in) {
  std::vector<std::string> out;
  for (const std::string& a : in) {
    std::stringstream ss(a);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (!item.empty()) out.push_back(item);
    }
  }
  for (const std::string& a : out)
    cuda::Arch::parse(a);  // UnsupportedError naming the arch
  return out;
}

// Random normal values in `dtype` (bits), deterministic in the seed.
std::vector<char> random_tensor(DType dtype, size_t n, uint64_t seed) {
  std::vector<char> bytes(n * dtype_size(dtype));
  if (dtype == DType::BF16) {
    const std::vector<uint16_t> v = random_bf16(n, seed);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    return bytes;
  }
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  for (size_t i = 0; i < n; ++i) {
    const float x = nd(rng);
    if (dtype == DType::F32) {
      std::memcpy(bytes.data() + 4 * i, &x, 4);
    } else {  // f16 through bf16 would lose bits; a plain conversion of a small normal value
      uint32_t u;
      std::memcpy(&u, &x, 4);
      const uint32_t sign = (u >> 16) & 0x8000;
      const int exp = static_cast<int>((u >> 23) & 0xff) - 127 + 15;
      uint16_t h = static_cast<uint16_t>(sign);
      if (exp > 0 && exp < 31) h = static_cast<uint16_t>(sign | (exp << 10) | ((u >> 13) & 0x3ff));
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  return bytes;
}

// The extent of a buffer dimension named in a .fx declaration, for a workload shape; -1 when
// the name is not one flexjit tune knows. R (relative positions) spans Sq + Skv.
int64_t dim_extent(const std::string& d, const tune::WorkloadShape& s, int64_t hkv) {
  if (!d.empty() && std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    errno = 0;
    const long long n = std::strtoll(d.c_str(), nullptr, 10);
    if (errno == ERANGE) throw Error(fmt::format("a buffer's declared extent {} is too large", d));
    return n;
  }
  if (d == "B") return s.batch;
  if (d == "H" || d == "Hq") return s.heads_q;
  if (d == "Hkv") return hkv;
  if (d == "S") return std::max(s.seqlen_q, s.seqlen_kv);  // indexed by q_idx and kv_idx
  if (d == "Skv") return s.seqlen_kv;
  if (d == "Sq") return s.seqlen_q;
  if (d == "R") return s.seqlen_q + s.seqlen_kv;
  return -1;
}

// The element count of a tensor of `shape`, made on the host and copied to the GPU for timing:
// an Error naming `what` and the shape when an extent is negative or the bytes overflow int64.
size_t checked_elements(const std::vector<int64_t>& shape, DType dt, std::string_view what) {
  const bool negative = std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; });
  const std::optional<int64_t> n = checked_product(shape);
  if (negative || !n || !checked_mul(*n, dtype_size(dt))) {
    throw Error(fmt::format("{} of shape [{}] has a negative extent or more than 2^63 bytes", what,
                            fmt::join(shape, ", ")));
  }
  return static_cast<size_t>(*n);
}

// Representative contents of a captured buffer: ALiBi slopes for `slopes`, the anchors' packed
// documents for `doc_id`, small normal values for other float buffers, zeros otherwise.
std::vector<char> buffer_data(const Buffer& b, const tune::WorkloadShape& s, int64_t hkv,
                              std::vector<int64_t>* shape) {
  shape->clear();
  for (const std::string& d : b.decl()->dims)
    shape->push_back(dim_extent(d, s, hkv));
  const size_t n = checked_elements(*shape, b.dtype(), fmt::format("buffer '{}'", b.name()));
  std::vector<char> bytes(n * dtype_size(b.dtype()), 0);
  if (b.name() == "slopes" && b.dtype() == DType::F32) {
    for (size_t i = 0; i < n; ++i) {
      const float v = std::exp2(-8.0f * static_cast<float>(i % s.heads_q + 1) / s.heads_q);
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    }
  } else if (b.name() == "doc_id" && b.dtype() == DType::I32) {
    if (n > static_cast<size_t>(std::numeric_limits<int>::max())) {
      throw Error(fmt::format("buffer 'doc_id' has {} entries, more than 2^31 - 1", n));
    }
    const std::vector<int32_t> ids = anchor_document_ids(static_cast<int>(n));
    std::memcpy(bytes.data(), ids.data(), bytes.size());
  } else if (b.dtype() == DType::F32) {
    std::vector<char> r = random_tensor(DType::F32, n, 7);
    for (size_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, r.data() + 4 * i, 4);
      v *= 0.1f;
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    }
  } else if (b.dtype() == DType::BF16 || b.dtype() == DType::F16) {
    bytes = random_tensor(b.dtype(), n, 7);
  }
  return bytes;
}

struct TimedItem {
  std::string what;
  std::string outcome;  // "tuned", "already tuned", "skipped: ...", "failed: ..."
  double seconds = 0;
};

// Device tensors of random normal values.
DeviceTensor random_device(Context& ctx, DType dt, const std::vector<int64_t>& shape,
                           uint64_t seed) {
  const size_t n = checked_elements(shape, dt, "an input tensor");
  return DeviceTensor::from_host(ctx, dt, shape, random_tensor(dt, n, seed).data());
}

// A workload shape's inputs, made once for its kind's call.
struct WorkloadInputs {
  const tune::Workload& w;
  DType dtype;
  std::pair<int, int> head_dims;
  const tune::WorkloadShape& shape;
  int64_t max_pages = 0;  // page_size > 0: pages per sequence in the pool
  DeviceTensor q, k, v;
  AttentionOptions options;  // the mods, their bindings and block mask, autotune = search
};

// forward: flex_attention.
void call_forward(Context& ctx, WorkloadInputs& in) {
  flex_attention(ctx, in.q, in.k, in.v, in.options);
}

// backward: flex_attention_backward after an untuned forward for out and lse.
void call_backward(Context& ctx, WorkloadInputs& in) {
  AttentionOptions fwd = in.options;
  fwd.autotune = AutotuneMode::Off;  // the forward is a forward workload's to tune
  fwd.return_lse = true;
  const AttentionResult r = flex_attention(ctx, in.q, in.k, in.v, fwd);
  const tune::WorkloadShape& s = in.shape;
  const DeviceTensor dout =
      random_device(ctx, in.dtype, {s.batch, s.heads_q, s.seqlen_q, in.head_dims.second}, 4);
  flex_attention_backward(ctx, in.q, in.k, in.v, r.out, r.lse, dout, in.options);
}

// decode: flex_attention on a KV cache (pages shuffled in the pool with page_size, else
// contiguous K / V), the decode plan whatever the query length.
void call_decode(Context& ctx, WorkloadInputs& in) {
  const tune::WorkloadShape& s = in.shape;
  const std::vector<int32_t> lens(static_cast<size_t>(s.batch), static_cast<int32_t>(s.seqlen_kv));
  const DeviceTensor seq_lens = DeviceTensor::from_host(ctx, DType::I32, {s.batch}, lens.data());
  DeviceTensor table;
  KvCache cache;
  cache.seq_lens = seq_lens.ref();
  if (in.w.page_size > 0) {
    std::vector<int32_t> pages(static_cast<size_t>(s.batch * in.max_pages));
    for (size_t i = 0; i < pages.size(); ++i)
      pages[i] = static_cast<int32_t>(i);
    std::shuffle(pages.begin(), pages.end(), std::mt19937(0x9a6e));
    table = DeviceTensor::from_host(ctx, DType::I32, {s.batch, in.max_pages}, pages.data());
    cache.page_table = table.ref();
  }
  AttentionOptions o = in.options;
  o.kv_cache = &cache;
  flex_attention(ctx, in.q, in.k, in.v, o);
}

// The public call that runs each workload kind's plan (FamilyInfo::kind). This table stays here,
// not in the family records: a kind is a public entry point (flex_attention,
// flex_attention_backward, flex_attention over a KV cache), which sits above kernels/ where the
// records live (docs/architecture.md, "Layers"), and a call needs inputs made for it. A new family
// of one of these kinds needs no edit; a new kind (a new entry point) adds its row.
using KindCall = void (*)(Context&, WorkloadInputs&);
const std::map<std::string, KindCall, std::less<>>& kind_calls() {
  static const std::map<std::string, KindCall, std::less<>> calls = {
      {"forward", call_forward}, {"backward", call_backward}, {"decode", call_decode}};
  return calls;
}

// Why workloads of `kind` cannot be timed (no call runs its plan), or nullopt.
std::optional<std::string> untimed_kind(const std::string& kind) {
  if (kind_calls().count(kind) != 0) return std::nullopt;
  std::vector<std::string> timed;
  for (const auto& [name, call] : kind_calls())
    timed.push_back(name);
  return fmt::format(
      "skipped: flexjit tune has no call for workloads of kind '{}' (it times {}); its kernels "
      "are warmed, not tuned",
      kind, fmt::join(timed, ", "));
}

// Runs the workload's call once in search mode: its kernels are tuned on these inputs (a stored
// winner is kept). K and V are paged (a pool of page_size pages) where the workload gives a
// page_size (its kind runs on a paged KV cache: FamilyInfo::kv_pages).
void run_workload_call(Context& ctx, const tune::Workload& w, DType dt, std::pair<int, int> hd,
                       int gqa, const tune::WorkloadShape& s) {
  const KindCall call = kind_calls().at(w.kind);  // time_workloads skipped the others
  const int64_t hkv = s.heads_q / gqa;
  const std::vector<int64_t> qs = {s.batch, s.heads_q, s.seqlen_q, hd.first};
  std::vector<int64_t> ks = {s.batch, hkv, s.seqlen_kv, hd.first};
  std::vector<int64_t> vs = {s.batch, hkv, s.seqlen_kv, hd.second};
  int64_t capacity = s.seqlen_kv, max_pages = 0;
  if (w.page_size > 0) {
    // The manifest bounds every field by 2^31 - 1, so these fit int64; the pool's element count
    // is checked where it is allocated (checked_elements).
    max_pages = (s.seqlen_kv + w.page_size - 1) / w.page_size;
    capacity = max_pages * w.page_size;
    if (capacity > std::numeric_limits<int32_t>::max()) {
      throw Error(fmt::format("Skv {} rounded up to whole pages of {} is {}, more than 2^31 - 1",
                              s.seqlen_kv, w.page_size, capacity));
    }
    ks = {s.batch * max_pages, w.page_size, hkv, hd.first};
    vs = {s.batch * max_pages, w.page_size, hkv, hd.second};
  }
  WorkloadInputs in{w,
                    dt,
                    hd,
                    s,
                    max_pages,
                    random_device(ctx, dt, qs, 1),
                    random_device(ctx, dt, ks, 2),
                    random_device(ctx, dt, vs, 3),
                    {}};
  AttentionOptions& o = in.options;
  o.mods = w.mods;
  o.autotune = AutotuneMode::Search;
  std::vector<DeviceTensor> buffers;
  for (const Buffer& b : w.mods.buffers) {
    std::vector<int64_t> shape;
    // A paged cache's positions run to whole pages: the buffers cover them.
    tune::WorkloadShape sized = s;
    sized.seqlen_kv = capacity;
    std::vector<char> data = buffer_data(b, sized, hkv, &shape);
    buffers.push_back(DeviceTensor::from_host(ctx, b.dtype(), shape, data.data()));
    o.bindings.buffers.emplace_back(b.name(), buffers.back().ref());
  }
  // The standard relative-bias mods index bias[q - kv + offset]: offset = Skv keeps the index in
  // [1, Sq + Skv) for the R = Sq + Skv entries made above.
  for (const Param& p : w.mods.params) {
    if (p.name() == "offset") {
      o.bindings.params.emplace_back("offset", static_cast<double>(s.seqlen_kv));
    }
  }
  DeviceBlockMask mask;
  if (w.block_size > 0 && w.mods.mask_mod.defined()) {
    // The workload's own mask at the target shape: what its calls will pass.
    mask = create_block_mask(ctx, w.mods, 1, 1, static_cast<int>(s.seqlen_q),
                             static_cast<int>(capacity), w.block_size, o.bindings);
    o.block_mask = &mask;
  }
  call(ctx, in);
  ctx.synchronize();
}

// Times every workload shape on the GPU (search mode: a stored winner is kept).
std::vector<TimedItem> time_workloads(const tune::Manifest& m,
                                      const std::vector<std::string>& archs, bool quiet) {
  std::vector<TimedItem> items;
  Context ctx;
  const std::string device_arch = ctx.arch();
  for (const tune::Workload& w : m.workloads) {
    const std::vector<std::string>& wa = archs.empty() ? w.archs : archs;
    if (std::find(wa.begin(), wa.end(), device_arch) == wa.end()) continue;
    if (auto why = untimed_kind(w.kind)) {
      items.push_back({w.name, *why});
      continue;
    }
    std::string unknown;
    for (const Buffer& b : w.mods.buffers) {
      for (const std::string& d : b.decl()->dims) {
        if (dim_extent(d, {1, 1, 1, 1}, 1) < 0) unknown = fmt::format("{} ({})", b.name(), d);
      }
    }
    if (!unknown.empty()) {
      items.push_back(
          {w.name, fmt::format("skipped: buffer {} has a dimension flexjit tune cannot "
                               "size (it knows B, H, Hq, Hkv, S, Sq, Skv, R and numbers)",
                               unknown)});
      continue;
    }
    for (DType dt : w.dtypes) {
      for (auto hd : w.head_dims) {
        for (int gqa : w.gqa_ratios) {
          for (const tune::WorkloadShape& s : w.shapes) {
            TimedItem item;
            item.what =
                fmt::format("{} {} d={}/{} gqa={} B={} H={} Sq={} Skv={}", w.name, to_string(dt),
                            hd.first, hd.second, gqa, s.batch, s.heads_q, s.seqlen_q, s.seqlen_kv);
            const auto t0 = Clock::now();
            try {
              const uint64_t searches = tune::search_count();
              run_workload_call(ctx, w, dt, hd, gqa, s);
              item.outcome = tune::search_count() > searches ? "tuned" : "already tuned";
            } catch (const Error& e) {
              item.outcome = fmt::format("failed: {}", e.what());
            } catch (const std::bad_alloc&) {
              item.outcome = "failed: out of host memory for this shape's random inputs";
            }
            item.seconds = seconds_since(t0);
            if (!quiet) {
              std::fprintf(stderr, "tune %s: %s (%.1f s)\n", item.what.c_str(),
                           item.outcome.c_str(), item.seconds);
            }
            items.push_back(item);
          }
        }
      }
    }
  }
  return items;
}

void run_tune(const TuneArgs& a) {
  const auto t0 = Clock::now();
  if (a.jobs < 0)
    throw Error(fmt::format("--jobs is {}; it must be 0 (all cores) or more", a.jobs));
  const std::vector<std::string> archs = split_archs(a.archs);
  // Everything is checked before any work.
  const tune::Manifest manifest = tune::load_manifest(a.manifest);
  const tune::WarmPlan plan = tune::plan_warmup(manifest, archs, a.all_configs);
  for (const std::string& n : plan.notes)
    std::fprintf(stderr, "flexjit tune: %s\n", n.c_str());

  nlohmann::json items = nlohmann::json::array();
  if (a.dry_run) {
    for (const tune::WarmKernel& k : plan.kernels) {
      if (a.json) {
        items.push_back({{"workload", k.workload},
                         {"kernel", k.desc.str()},
                         {"mods", k.mods.name},
                         {"default", k.is_default}});
      } else {
        fmt::print("{}  {}  ({}{})\n", k.desc.str(), k.mods.name,
                   manifest.workloads[k.workload].name, k.is_default ? "" : ", candidate");
      }
    }
    if (a.json) {
      std::cout << nlohmann::json{{"kernels", items},
                                  {"notes", plan.notes},
                                  {"pruned", plan.pruned}}
                       .dump(2)
                << "\n";
    } else {
      fmt::print("{} kernels ({} configs pruned); nothing compiled (--dry-run)\n",
                 plan.kernels.size(), plan.pruned);
    }
    return;
  }

  KernelBuilder builder(jit::CacheSettings::from_env(), 0);
  if (builder.compiler().disk() == nullptr) {
    std::fprintf(stderr,
                 "flexjit tune: warning: no usable disk cache (%s); kernels are compiled but not "
                 "kept\n",
                 builder.compiler().disk_problem().empty()
                     ? "FLEXJIT_DISABLE_CACHE is set"
                     : builder.compiler().disk_problem().c_str());
  }
  Progress progress(plan.kernels.size(), a.json);
  std::vector<std::string> outcome(plan.kernels.size()), error(plan.kernels.size());
  std::vector<double> ms(plan.kernels.size(), 0);
  {
    tune::ThreadPool pool(a.jobs > 0 ? static_cast<size_t>(a.jobs) : 0);
    tune::parallel_for(pool, plan.kernels.size(), [&](size_t i) {
      const tune::WarmKernel& k = plan.kernels[i];
      try {
        const BuiltKernel b = builder.build(k.mods, k.desc);
        outcome[i] = b.compiled.outcome == jit::CacheOutcome::Compiled ? "compiled" : "cached";
        ms[i] = b.compiled.elapsed_ms;
      } catch (const Error& e) {
        outcome[i] = "failed";
        error[i] = e.what();
      }
      progress.step(fmt::format("{} {}", k.desc.str(), k.mods.name), outcome[i]);
    });
  }
  size_t compiled = 0, cached = 0, failed = 0;
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    compiled += outcome[i] == "compiled";
    cached += outcome[i] == "cached";
    failed += outcome[i] == "failed";
    if (outcome[i] == "failed" && !a.json) {
      std::fprintf(stderr, "flexjit tune: failed: %s %s: %s\n", plan.kernels[i].desc.str().c_str(),
                   plan.kernels[i].mods.name.c_str(), error[i].c_str());
    }
    items.push_back({{"workload", plan.kernels[i].workload},
                     {"kernel", plan.kernels[i].desc.str()},
                     {"mods", plan.kernels[i].mods.name},
                     {"outcome", outcome[i]},
                     {"ms", ms[i]},
                     {"error", error[i]}});
  }
  const double compile_s = seconds_since(t0);

  std::vector<TimedItem> timed;
  std::string timing_note;
  std::string why;
  if (a.no_time) {
    timing_note = "not timed (--no-time)";
  } else if (!runtime::cuda_available(&why)) {
    timing_note = fmt::format("not timed: no GPU ({})", why);
  } else {
    // create_block_mask reads its mode from the environment: search its kernels too.
    ::setenv("FLEXJIT_AUTOTUNE", "search", 1);
    timed = time_workloads(manifest, archs, a.json);
  }
  nlohmann::json timed_json = nlohmann::json::array();
  for (const TimedItem& t : timed)
    timed_json.push_back({{"workload", t.what}, {"outcome", t.outcome}, {"seconds", t.seconds}});
  const double total_s = seconds_since(t0);
  if (a.json) {
    std::cout << nlohmann::json{{"manifest", a.manifest},
                                {"kernels", plan.kernels.size()},
                                {"compiled", compiled},
                                {"cached", cached},
                                {"failed", failed},
                                {"pruned", plan.pruned},
                                {"jobs", a.jobs},
                                {"compile_seconds", compile_s},
                                {"seconds", total_s},
                                {"notes", plan.notes},
                                {"timing", timing_note.empty() ? "timed" : timing_note},
                                {"timed", timed_json},
                                {"items", items}}
                     .dump(2)
              << "\n";
  } else {
    fmt::print(
        "{} kernels: {} compiled, {} already cached, {} failed ({} configs pruned) in "
        "{:.1f} s\n",
        plan.kernels.size(), compiled, cached, failed, plan.pruned, compile_s);
    if (!timing_note.empty()) fmt::print("{}\n", timing_note);
    size_t tuned = 0, stored = 0;
    for (const TimedItem& t : timed) {
      tuned += t.outcome == "tuned";
      stored += t.outcome == "already tuned";
    }
    if (!timed.empty()) {
      fmt::print("{} workload shapes: {} tuned now, {} already tuned, {} skipped or failed\n",
                 timed.size(), tuned, stored, timed.size() - tuned - stored);
    }
  }
  if (failed > 0)
    throw Error(fmt::format("{} of {} kernels failed to compile", failed, plan.kernels.size()));
}

}  // namespace

void register_tune(CLI::App& app) {
  static TuneArgs a;
  auto* cmd = app.add_subcommand(
      "tune",
      "Warm the kernel cache and the tuning table for a manifest of workloads (docs/tuning.md)\n\n"
      "Without a GPU, compiles every kernel the workloads need for the archs into the disk cache;\n"
      "with one, also times the candidate configs of each workload (forward, backward,\n"
      "decode) and stores the winners. A second run skips what is done.\n\nExamples:\n"
      "  flexjit tune --manifest examples/tune/standard_manifest.json --arch sm_90a --jobs 16\n"
      "  flexjit tune --manifest deploy.json --arch sm_80,sm_90a --all-configs --json\n"
      "  flexjit tune --manifest deploy.json --dry-run");
  cmd->add_option("--manifest", a.manifest, "The workloads (JSON)")->required();
  cmd->add_option("--arch", a.archs,
                  "Target arch(s), repeatable or comma-separated (default: the manifest's)");
  cmd->add_option("--jobs,-j", a.jobs, "Parallel compiles (default 0: every core)");
  cmd->add_flag("--all-configs", a.all_configs,
                "Compile every pruned candidate config, not only the defaults");
  cmd->add_flag("--json", a.json, "Print a JSON summary (no progress)");
  cmd->add_flag("--dry-run", a.dry_run, "List the kernels; compile nothing");
  cmd->add_flag("--no-time", a.no_time, "Compile only, even with a GPU");
  cmd->callback([] { run_tune(a); });
}

}  // namespace flexjit::cli
