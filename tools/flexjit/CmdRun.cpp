// flexjit run: flex_attention on .npy inputs, written to .npy outputs — the way to check flexjit
// against any other implementation (PyTorch, JAX, a NumPy loop).
#include <flexjit/attention.h>
#include <flexjit/backward.h>
#include <flexjit/context_parallel.h>
#include <flexjit/cpu.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>
#include <flexjit/paged_kv.h>

#include "cpu/BackwardKernel.h"
#include "device/Device.h"
#include "flexjit/Commands.h"
#include "flexjit/Options.h"
#include "ir/Evaluate.h"
#include "runtime/CreateBlockMask.h"
#include "util/CheckedMath.h"
#include "util/Npy.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace flexjit::cli {

namespace {

struct RunOptions {
  std::string mods, score_mod, mask_mod;
  std::string q, k, v, out, lse;
  std::vector<std::string> buffers, params;
  std::string dtype = "auto";
  std::string descale;  // --descale Q,K,V: the e4m3 inputs' per-tensor factors
  float scale = 0.0f;
  bool has_scale = false;
  int block_size = kDefaultSparseBlockSize;
  int repeat = 5;
  bool json = false;
  std::string device = "auto";
  std::string random;  // "B,H,S,D": make q / k / v (and unbound buffers) instead of reading them
  bool check = false;
  int threads = 0;
  // The backward (with --dout): gradients written to .npy files.
  std::string dout, dq, dk, dv;
  std::vector<std::string> dbuffers;  // NAME=FILE.npy
  bool deterministic = false;
  // A KV cache (include/flexjit/paged_kv.h): int32 .npy files; an e4m3 cache's f32 [Hkv] scales.
  std::string page_table, seq_lens, k_scale, v_scale;
  bool check_pages = false;
  bool check_buffers = false;  // --check-buffers: AttentionOptions::check_buffers
  std::string math = "auto";   // --math: the GPU kernels' transcendentals (the CPU is exact)
  // Context parallelism checked on the CPU (--cp-shards N): flex_attention_cp_cpu.
  int cp_shards = 0;
  std::string cp_strategy = "ring", cp_layout = "zigzag";
};

std::pair<std::string, std::string> split_binding(const std::string& s, const char* flag) {
  const size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size()) {
    throw Error(fmt::format("{} '{}': expected NAME=VALUE", flag, s));
  }
  return {s.substr(0, eq), s.substr(eq + 1)};
}

// The dtypes --dtype takes for q, k, v.
bool input_dtype(DType t) {
  return t == DType::F16 || t == DType::BF16 || t == DType::F32 || t == DType::E4M3;
}

// Reads q / k / v: f16 or bf16 (a '<u2' file is bf16 unless --dtype f16 says it holds f16
// bits), f32 (rejected later by flex_attention with the reason), or e4m3 ('|V1', as ml_dtypes'
// float8_e4m3fn saves; factors from --descale).
npy::Array read_input(const std::string& path, const char* name, const std::string& dtype) {
  npy::Array a = npy::read(path);
  if (dtype == "f16" && a.dtype == DType::BF16) a.dtype = DType::F16;  // uint16 bits of f16
  if (dtype != "auto") {
    auto want = parse_dtype(dtype);
    if (!want || !input_dtype(*want)) {
      throw Error(fmt::format("--dtype '{}': use auto, bf16, f16, f32 or e4m3", dtype));
    }
    if (a.dtype != *want) {
      throw Error(fmt::format("--{} {}: holds {} but --dtype says {}", name, path,
                              to_string(a.dtype), dtype));
    }
  }
  if (!input_dtype(a.dtype)) {
    throw Error(
        fmt::format("--{} {}: holds {}; q, k and v must be float16, bfloat16 (saved as "
                    "uint16), float32 or float8_e4m3fn (saved as |V1)",
                    name, path, to_string(a.dtype)));
  }
  if (a.shape.size() != 4) {
    throw Error(
        fmt::format("--{} {}: has {} dims; expected 4 ([B, H, S, D])", name, path, a.shape.size()));
  }
  return a;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// --random B,H,S,D: [B, H, S, D] of N(0, 1) values, f32 (or the bits of --dtype bf16 / f16; or
// for e4m3 x / descale rounded to e4m3, with descale = max |x| / 448 unless *descale > 0 gives
// it; *descale is set to the factor used).
npy::Array random_input(const std::string& flag, const std::vector<int64_t>& shape, DType dtype,
                        uint32_t seed, float* descale = nullptr) {
  npy::Array a;
  try {
    a = npy::make_array(dtype, shape);
  } catch (const Error& e) {
    throw Error(fmt::format("--random {}: {}", flag, e.what()));
  }
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  if (dtype == DType::E4M3) {
    std::vector<float> x(static_cast<size_t>(a.numel()));
    float amax = 0.0f;
    for (float& e : x) {
      e = n01(rng);
      amax = std::max(amax, std::abs(e));
    }
    if (*descale <= 0.0f) *descale = std::max(amax, 1e-6f) / 448.0f;
    for (size_t i = 0; i < x.size(); ++i)
      reinterpret_cast<uint8_t*>(a.bytes.data())[i] = ir::float_to_e4m3_bits(x[i] / *descale);
    return a;
  }
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = n01(rng);
    if (dtype == DType::F32) {
      reinterpret_cast<float*>(a.bytes.data())[i] = x;
    } else {
      reinterpret_cast<uint16_t*>(a.bytes.data())[i] =
          dtype == DType::F16 ? ir::float_to_f16_bits(x) : ir::float_to_bf16_bits(x);
    }
  }
  return a;
}

std::vector<int64_t> parse_random(const std::string& text) {
  std::vector<int64_t> dims;
  std::stringstream ss(text);
  std::string part;
  constexpr long long kMaxExtent = 1 << 24;
  constexpr const char* kNames[] = {"B", "H", "S", "D"};
  while (std::getline(ss, part, ',')) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(part.c_str(), &end, 10);
    if (end == part.c_str() || *end != '\0') {
      throw Error(
          fmt::format("--random '{}': '{}' is not an integer; expected B,H,S,D", text, part));
    }
    const char* what = dims.size() < 4 ? kNames[dims.size()] : "a dimension";
    if (v < 0) throw Error(fmt::format("--random '{}': {} = {} is negative", text, what, v));
    if (errno == ERANGE || v > kMaxExtent) {
      throw Error(
          fmt::format("--random '{}': {} = {} is more than {} (2^24), the largest extent "
                      "--random makes; save larger inputs as .npy files (--q, --k, --v)",
                      text, what, part, kMaxExtent));
    }
    dims.push_back(v);
  }
  if (dims.size() != 4) {
    throw Error(fmt::format("--random '{}': expected four numbers B,H,S,D", text));
  }
  if (!checked_product({dims[0], dims[1], dims[2], dims[3], 4})) {
    throw Error(fmt::format("--random {}: {} x {} x {} x {} elements is more than 2^63 bytes", text,
                            dims[0], dims[1], dims[2], dims[3]));
  }
  return dims;
}

// Deterministic contents for a buffer --random leaves unbound: a dim named H is the head count,
// S the sequence length, R 2 * S, a number itself. Floats are ALiBi-like slopes
// exp2(-8 (i + 1) / n); i32 entries are documents of 128 positions (i / 128); bools true.
npy::Array default_buffer(const Buffer& buf, int64_t heads, int64_t seq) {
  std::vector<int64_t> shape;
  for (const std::string& d : buf.decl()->dims) {
    if (d == "H") {
      shape.push_back(heads);
    } else if (d == "R") {
      shape.push_back(2 * seq);
    } else if (!d.empty() && std::isdigit(static_cast<unsigned char>(d[0]))) {
      errno = 0;
      const long long n = std::strtoll(d.c_str(), nullptr, 10);
      if (errno == ERANGE) {
        throw Error(fmt::format("buffer '{}': declared extent {} is too large", buf.name(), d));
      }
      shape.push_back(n);
    } else {
      shape.push_back(seq);
    }
  }
  npy::Array a;
  try {
    a = npy::make_array(buf.dtype(), shape);
  } catch (const Error& e) {
    throw Error(
        fmt::format("--random: buffer '{}' (bind it with --buffer): {}", buf.name(), e.what()));
  }
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float slope = std::exp2(-8.0f * static_cast<float>(i + 1) / static_cast<float>(n));
    switch (buf.dtype()) {
      case DType::F32:
        reinterpret_cast<float*>(a.bytes.data())[i] = slope;
        break;
      case DType::F16:
        reinterpret_cast<uint16_t*>(a.bytes.data())[i] = ir::float_to_f16_bits(slope);
        break;
      case DType::BF16:
        reinterpret_cast<uint16_t*>(a.bytes.data())[i] = ir::float_to_bf16_bits(slope);
        break;
      case DType::I32:
        reinterpret_cast<int32_t*>(a.bytes.data())[i] = static_cast<int32_t>(i / 128);
        break;
      default:
        a.bytes[static_cast<size_t>(i)] = 1;
        break;
    }
  }
  return a;
}

float element(const npy::Array& a, int64_t i) {
  switch (a.dtype) {
    case DType::F32:
      return a.as<float>()[i];
    case DType::F16:
      return ir::f16_bits_to_float(a.as<uint16_t>()[i]);
    case DType::BF16:
      return ir::bf16_bits_to_float(a.as<uint16_t>()[i]);
    case DType::E4M3:
      return ir::e4m3_bits_to_float(a.as<uint8_t>()[i]);
    default:
      return 0.0f;
  }
}

// Everything a run needs, read or made on the host.
struct Inputs {
  Mods mods;
  npy::Array q, k, v;
  npy::Array page_table, seq_lens;  // numel 0 / empty shape: not given
  npy::Array k_scale, v_scale;      // an e4m3 KV cache's scales (empty shape: not given)
  std::vector<std::pair<std::string, npy::Array>> buffers;
  std::vector<std::pair<std::string, double>> params;
  // e4m3 q, k, v: their per-tensor descale factors (AttentionOptions::descale).
  std::vector<float> descale;
};

// --descale Q,K,V: three positive factors (e4m3 inputs only).
std::vector<float> parse_descale(const std::string& text) {
  std::vector<float> f;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string part = text.substr(start, comma - start);
    char* end = nullptr;
    const float x = std::strtof(part.c_str(), &end);
    if (part.empty() || *end != '\0' || !(x > 0.0f) || !std::isfinite(x)) {
      throw Error(fmt::format("--descale '{}': '{}' is not a positive number (expected Q,K,V)",
                              text, part));
    }
    f.push_back(x);
    start = comma + 1;
  }
  if (f.size() != 3) {
    throw Error(
        fmt::format("--descale '{}': expected three factors Q,K,V, not {}", text, f.size()));
  }
  return f;
}

Inputs prepare(const RunOptions& o, bool on_cpu) {
  Inputs in;
  KernelOptions ko;
  ko.mods = o.mods;
  ko.score_mod = o.score_mod;
  ko.mask_mod = o.mask_mod;
  in.mods = resolve(ko);
  if (!o.random.empty()) {
    const std::vector<int64_t> d = parse_random(o.random);
    DType dt = on_cpu ? DType::F32 : DType::BF16;
    if (o.dtype != "auto") {
      auto want = parse_dtype(o.dtype);
      if (!want || !input_dtype(*want)) {
        throw Error(fmt::format("--dtype '{}': use auto, bf16, f16, f32 or e4m3", o.dtype));
      }
      dt = *want;
    }
    // e4m3: each tensor quantized with its --descale factor, or max |x| / 448.
    in.descale = o.descale.empty() ? std::vector<float>(3, 0.0f) : parse_descale(o.descale);
    in.q = random_input(o.random, d, dt, 1, &in.descale[0]);
    in.k = random_input(o.random, d, dt, 2, &in.descale[1]);
    in.v = random_input(o.random, d, dt, 3, &in.descale[2]);
    if (dt != DType::E4M3) in.descale.clear();
  } else {
    if (o.q.empty() || o.k.empty() || o.v.empty()) {
      throw Error("flexjit run: give --q, --k and --v (.npy files), or --random B,H,S,D");
    }
    in.q = read_input(o.q, "q", o.dtype);
    in.k = read_input(o.k, "k", o.dtype);
    in.v = read_input(o.v, "v", o.dtype);
    if (in.q.dtype == DType::E4M3) {
      in.descale = o.descale.empty() ? std::vector<float>(3, 1.0f) : parse_descale(o.descale);
    }
  }
  if (!o.descale.empty() && in.descale.empty()) {
    throw Error(fmt::format("--descale applies to e4m3 inputs (--dtype e4m3); q is {}",
                            to_string(in.q.dtype)));
  }
  if (!o.page_table.empty() || !o.seq_lens.empty()) {
    if (!o.random.empty()) {
      throw Error("--page-table / --seq-lens read a KV cache from files: give --q, --k, --v too");
    }
    if (!o.page_table.empty()) in.page_table = npy::read(o.page_table);
    if (!o.seq_lens.empty()) in.seq_lens = npy::read(o.seq_lens);
    if (!o.k_scale.empty()) in.k_scale = npy::read(o.k_scale);
    if (!o.v_scale.empty()) in.v_scale = npy::read(o.v_scale);
  } else if (!o.k_scale.empty() || !o.v_scale.empty()) {
    throw Error("--k-scale / --v-scale dequantize an e4m3 KV cache: give --seq-lens too");
  }
  for (const std::string& b : o.buffers) {
    auto [name, path] = split_binding(b, "--buffer");
    in.buffers.emplace_back(name, npy::read(path));
  }
  for (const Buffer& buf : in.mods.buffers) {
    const bool bound = std::any_of(in.buffers.begin(), in.buffers.end(),
                                   [&](const auto& p) { return p.first == buf.name(); });
    if (bound) continue;
    if (o.random.empty()) {
      // In the CLI's terms (the library would say "bindings.buffers").
      throw Error(fmt::format(
          "the mods '{}' capture buffer '{}' ({}[{}]); give it with --buffer {}=FILE.npy",
          in.mods.name, buf.name(), to_string(buf.dtype()), fmt::join(buf.decl()->dims, ", "),
          buf.name()));
    }
    in.buffers.emplace_back(
        buf.name(), default_buffer(buf, in.q.shape[1], std::max(in.q.shape[2], in.k.shape[2])));
  }
  for (const std::string& p : o.params) {
    auto [name, text] = split_binding(p, "--param");
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0') {
      throw Error(fmt::format("--param {}: '{}' is not a number", name, text));
    }
    in.params.emplace_back(name, value);
  }
  // A relative bias read with --random: its offset defaults to the sequence length (R = 2 S).
  if (!o.random.empty()) {
    for (const Param& p : in.mods.params) {
      const bool given = std::any_of(in.params.begin(), in.params.end(),
                                     [&](const auto& x) { return x.first == p.name(); });
      if (!given && p.name() == "offset") {
        in.params.emplace_back("offset",
                               static_cast<double>(std::max(in.q.shape[2], in.k.shape[2])));
      }
    }
  }
  return in;
}

AttentionOptions host_options(const RunOptions& o, const Inputs& in) {
  AttentionOptions opts;
  opts.mods = in.mods;
  for (const auto& [name, a] : in.buffers)
    opts.bindings.buffers.emplace_back(name, a.view());
  opts.bindings.params = in.params;
  if (o.has_scale) opts.scale = o.scale;
  opts.check_buffers = o.check_buffers;
  if (!in.descale.empty()) {
    auto factor = [&](int i) {
      return TensorRef::contiguous(const_cast<float*>(&in.descale[static_cast<size_t>(i)]),
                                   DType::F32, {1});
    };
    opts.descale = {factor(0), factor(1), factor(2)};
  }
  return opts;
}

struct Summary {
  double checksum = 0, max_abs = 0;  // max_abs over the finite values (NaN and inf counted apart)
  int64_t nan = 0, inf = 0, finite = 0;
  std::vector<float> first;
  // "max |out| 1.234567", or "no finite values" when every element is NaN or inf.
  std::string max_text(const char* name) const {
    return finite > 0 ? fmt::format("max |{}| {:.6f}", name, max_abs)
                      : fmt::format("max |{}| -: no finite values", name);
  }
  // ", 16 NaN, 2 inf" (empty when every element is finite).
  std::string nonfinite_text() const {
    return fmt::format("{}{}", nan > 0 ? fmt::format(", {} NaN", nan) : "",
                       inf > 0 ? fmt::format(", {} inf", inf) : "");
  }
};

Summary summarize(const npy::Array& out) {
  Summary s;
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double x = element(out, i);
    s.checksum += x;
    if (std::isnan(x)) {
      ++s.nan;
    } else if (std::isinf(x)) {
      ++s.inf;
    } else {
      ++s.finite;
      s.max_abs = std::max(s.max_abs, std::abs(x));
    }
    if (i < 4) s.first.push_back(static_cast<float>(x));
  }
  return s;
}

// How far out is from the CPU backend's fp64 reference mode: max |out - ref| / max |ref| over
// the elements where both are finite, and how many elements are NaN or inf in one and not the
// same in the other (a NaN or inf where the reference has a number is an error, never dropped:
// --check fails on it).
struct CheckResult {
  double rel = 0;
  int64_t nonfinite_mismatches = 0;
  int64_t first_mismatch = -1;  // flat index of the first one
  double first_got = 0, first_want = 0;
};

bool has_kv_cache(const Inputs& in) {
  return !in.page_table.shape.empty() || !in.seq_lens.shape.empty();
}

// The KV cache of the call as host tensors (the CPU backend reads them; views of `in`).
KvCache host_kv_cache(const RunOptions& o, const Inputs& in) {
  KvCache cache;
  if (!in.page_table.shape.empty()) cache.page_table = in.page_table.view();
  if (!in.seq_lens.shape.empty()) cache.seq_lens = in.seq_lens.view();
  if (!in.k_scale.shape.empty()) cache.k_scale = in.k_scale.view();
  if (!in.v_scale.shape.empty()) cache.v_scale = in.v_scale.view();
  cache.check_pages = o.check_pages;
  return cache;
}

CheckResult check_against_reference(const RunOptions& o, const Inputs& in, const npy::Array& out) {
  AttentionOptions opts = host_options(o, in);
  CpuRunOptions cro;
  cro.reference_f64 = true;
  cro.num_threads = o.threads;
  // On a KV cache the whole batch at once (mods that read b see each sequence's b).
  const KvCache cache = host_kv_cache(o, in);
  if (has_kv_cache(in)) opts.kv_cache = &cache;
  const CpuAttentionResult all =
      flex_attention_cpu(in.q.view(), in.k.view(), in.v.view(), opts, cro);
  const std::vector<float>& ref_out = all.out;
  CheckResult r;
  double err = 0, scale = 0;
  for (size_t i = 0; i < ref_out.size(); ++i) {
    const double x = element(out, static_cast<int64_t>(i)), want = ref_out[i];
    const bool finite = std::isfinite(x) && std::isfinite(want);
    // Not finite in either: they must agree (NaN with NaN, inf with the same inf).
    if (!finite && !(std::isnan(x) && std::isnan(want)) && !(x == want)) {
      if (r.nonfinite_mismatches++ == 0) {
        r.first_mismatch = static_cast<int64_t>(i);
        r.first_got = x;
        r.first_want = want;
      }
    }
    if (!finite) continue;
    const double diff = std::abs(x - want);
    if (!(diff <= err)) err = diff;
    scale = std::max(scale, std::abs(want));
  }
  r.rel = scale > 0 && std::isfinite(scale) ? err / scale : err;
  return r;
}

// --check fails (exit 1) when out has NaN or inf where the reference does not have the same.
void fail_on_nonfinite_mismatches(const CheckResult& r, const npy::Array& out) {
  if (r.nonfinite_mismatches == 0) return;
  std::vector<int64_t> index(out.shape.size());
  int64_t rest = r.first_mismatch;
  for (size_t d = out.shape.size(); d-- > 0;) {
    index[d] = out.shape[d] > 0 ? rest % out.shape[d] : 0;
    rest = out.shape[d] > 0 ? rest / out.shape[d] : 0;
  }
  auto text = [](double x) {
    return std::isnan(x) ? std::string("NaN") : fmt::format("{:.6g}", x);  // "inf", "-inf"
  };
  std::fflush(stdout);
  throw Error(fmt::format(
      "--check: {} outputs are NaN or inf where the fp64 CPU reference is not the same; the first "
      "is out[{}] = {} where the reference has {}",
      r.nonfinite_mismatches, fmt::join(index, ", "), text(r.first_got), text(r.first_want)));
}

void report(const RunOptions& o, const Inputs& in, const std::string& device, const npy::Array& out,
            double mask_seconds, bool has_mask, double first_seconds, double median, bool timed) {
  const Summary sum = summarize(out);
  std::optional<CheckResult> rel;
  if (o.check) rel = check_against_reference(o, in, out);
  const std::string qs = in.q.view().str();
  if (o.json) {
    nlohmann::json j = {{"device", device},
                        {"mods", in.mods.name},
                        {"dtype", std::string(to_string(in.q.dtype))},
                        {"q", in.q.shape},
                        {"k", in.k.shape},
                        {"v", in.v.shape},
                        {"out", o.out},
                        {"lse", o.lse},
                        {"block_mask_ms", mask_seconds * 1e3},
                        {"first_call_ms", first_seconds * 1e3},
                        {"median_ms", median * 1e3},
                        {"repeat", o.repeat},
                        {"checksum", sum.checksum},
                        {"max_abs", sum.max_abs},
                        {"finite", sum.finite},
                        {"nan", sum.nan},
                        {"inf", sum.inf}};
    if (rel) {
      j["max_rel_error_vs_fp64"] = rel->rel;
      j["nonfinite_mismatches_vs_fp64"] = rel->nonfinite_mismatches;
    }
    std::printf("%s\n", j.dump(2).c_str());
    if (rel) fail_on_nonfinite_mismatches(*rel, out);
    return;
  }
  std::printf("%s on %s: q %s -> out [%s]%s%s\n", in.mods.name.c_str(), device.c_str(), qs.c_str(),
              fmt::format("{}", fmt::join(out.shape, ", ")).c_str(), o.out.empty() ? "" : " ",
              o.out.c_str());
  if (has_mask) std::printf("block mask (%d): %.2f ms\n", o.block_size, mask_seconds * 1e3);
  std::printf("first call (compile or cache load + run): %.2f ms\n", first_seconds * 1e3);
  if (timed) std::printf("median of %d runs: %.3f ms\n", o.repeat, median * 1e3);
  std::printf("out: checksum %.6f, %s, first values %s%s\n", sum.checksum,
              sum.max_text("out").c_str(), fmt::format("{:.6f}", fmt::join(sum.first, " ")).c_str(),
              sum.nonfinite_text().c_str());
  if (rel) {
    std::printf("max relative error vs the fp64 CPU reference: %.3g", rel->rel);
    if (rel->nonfinite_mismatches > 0) {
      std::printf(" over the finite values (and %lld outputs NaN or inf in one and not the other)",
                  static_cast<long long>(rel->nonfinite_mismatches));
    }
    std::printf("\n");
    fail_on_nonfinite_mismatches(*rel, out);
  }
}

// The backward's outputs by name: --dq / --dk / --dv and --dbuffer NAME=FILE.
struct GradientFiles {
  std::vector<std::pair<std::string, std::string>> buffers;  // name, file
};

// Checks the backward's flags against the mods before any work.
GradientFiles gradient_files(const RunOptions& o, const Mods& mods) {
  GradientFiles g;
  for (const std::string& b : o.dbuffers) {
    g.buffers.push_back(split_binding(b, "--dbuffer"));
    const std::string& name = g.buffers.back().first;
    const bool is_float =
        std::any_of(mods.buffers.begin(), mods.buffers.end(), [&](const Buffer& x) {
          return x.name() == name &&
                 (x.dtype() == DType::F32 || x.dtype() == DType::F16 || x.dtype() == DType::BF16);
        });
    if (!is_float) {
      throw Error(fmt::format("--dbuffer {}: the mods '{}' have no float buffer '{}'", name,
                              mods.name, name));
    }
  }
  if (o.dout.empty() &&
      (!o.dq.empty() || !o.dk.empty() || !o.dv.empty() || !g.buffers.empty() || o.deterministic)) {
    throw Error(
        "--dq, --dk, --dv, --dbuffer and --deterministic need --dout (the backward's input)");
  }
  return g;
}

void print_gradient(const char* name, const npy::Array& a, const std::string& file) {
  const Summary s = summarize(a);
  std::printf("%s: checksum %.6f, %s%s%s%s\n", name, s.checksum, s.max_text(name).c_str(),
              s.nonfinite_text().c_str(), file.empty() ? "" : " -> ", file.c_str());
  if (!file.empty()) npy::write(file, a);
}

// Writes every buffer gradient the mods have; those without a --dbuffer file are summarized.
void write_buffer_gradients(const GradientFiles& files,
                            const std::vector<std::pair<std::string, npy::Array>>& grads) {
  for (const auto& [name, a] : grads) {
    std::string file;
    for (const auto& [n, f] : files.buffers)
      if (n == name) file = f;
    print_gradient(("d" + name).c_str(), a, file);
  }
}

// Prints (and writes where asked) gradients the CPU backend computed as f32 vectors: dq, dk,
// dv in the inputs' shapes and each float buffer's gradient in its buffer's shape.
void write_cpu_gradients(const RunOptions& o, const Inputs& in, const std::vector<float>& dq,
                         const std::vector<float>& dk, const std::vector<float>& dv,
                         const std::map<std::string, std::vector<float>>& buffer_grads,
                         const GradientFiles& files) {
  auto array = [](const std::vector<float>& v, const std::vector<int64_t>& shape) {
    npy::Array a = npy::make_array(DType::F32, shape);
    std::memcpy(a.bytes.data(), v.data(), v.size() * sizeof(float));
    return a;
  };
  print_gradient("dq", array(dq, in.q.shape), o.dq);
  print_gradient("dk", array(dk, in.k.shape), o.dk);
  print_gradient("dv", array(dv, in.v.shape), o.dv);
  std::vector<std::pair<std::string, npy::Array>> buffers;
  for (const auto& [name, v] : buffer_grads) {
    for (const auto& [bname, b] : in.buffers)
      if (bname == name) buffers.emplace_back(name, array(v, b.shape));
  }
  write_buffer_gradients(files, buffers);
}

void run_backward_cpu(const RunOptions& o, const Inputs& in, const AttentionOptions& opts,
                      const npy::Array& out, const npy::Array& lse, const GradientFiles& files) {
  const npy::Array dout = read_input(o.dout, "dout", o.dtype);
  cpu::CpuBackwardOptions bo;
  if (o.has_scale) bo.scale = o.scale;
  bo.num_threads = o.threads;
  const auto t0 = std::chrono::steady_clock::now();
  const cpu::CpuGradients<float> g =
      cpu::cpu_attention_backward(in.mods, opts.bindings, in.q.view(), in.k.view(), in.v.view(),
                                  out.as<float>(), lse.as<float>(), dout.view(), bo);
  std::printf("backward on cpu: %.2f ms\n", seconds_since(t0) * 1e3);
  write_cpu_gradients(o, in, g.dq, g.dk, g.dv, g.buffers, files);
}

// --cp-shards N with --dout: the backward shard by shard (flex_attention_cp_backward_cpu) on the
// sharded forward's out and lse; --check compares it with the unsharded CPU backward on the same.
void run_backward_cpu_cp(const RunOptions& o, const Inputs& in, const AttentionOptions& opts,
                         const npy::Array& out, const npy::Array& lse, CpStrategy strategy,
                         CpLayout layout, const GradientFiles& files) {
  const npy::Array dout = read_input(o.dout, "dout", o.dtype);
  CpuRunOptions cro;
  cro.num_threads = o.threads;
  const auto t0 = std::chrono::steady_clock::now();
  const CpuContextParallelGradients g =
      flex_attention_cp_backward_cpu(in.q.view(), in.k.view(), in.v.view(), out.view(), lse.view(),
                                     dout.view(), o.cp_shards, opts, {strategy, layout}, cro);
  std::printf("context-parallel backward: %lld calls, %.2f ms on the cpu\n",
              static_cast<long long>(g.calls), seconds_since(t0) * 1e3);
  write_cpu_gradients(o, in, g.dq, g.dk, g.dv, g.buffer_grads, files);
  if (!o.check) return;
  cpu::CpuBackwardOptions bo;
  if (o.has_scale) bo.scale = o.scale;
  bo.num_threads = o.threads;
  const cpu::CpuGradients<float> whole =
      cpu::cpu_attention_backward(in.mods, opts.bindings, in.q.view(), in.k.view(), in.v.view(),
                                  out.as<float>(), lse.as<float>(), dout.view(), bo);
  // max |sharded - unsharded| / max |unsharded| per gradient (sums in another order).
  double worst = 0;
  std::string text;
  auto compare = [&](const char* name, const std::vector<float>& got,
                     const std::vector<float>& want) {
    double err = 0, scale = 0;
    for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
      const double d = std::abs(static_cast<double>(got[i]) - want[i]);
      err = std::isnan(d) ? INFINITY : std::max(err, d);
      scale = std::max(scale, static_cast<double>(std::abs(want[i])));
    }
    const double rel = scale > 0 ? err / scale : err;
    worst = std::max(worst, rel);
    text += fmt::format("{}{} {:.3g}", text.empty() ? "" : ", ", name, rel);
  };
  compare("dq", g.dq, whole.dq);
  compare("dk", g.dk, whole.dk);
  compare("dv", g.dv, whole.dv);
  for (const auto& [name, want] : whole.buffers) {
    const auto it = g.buffer_grads.find(name);
    if (it == g.buffer_grads.end() || it->second.size() != want.size()) {
      worst = INFINITY;
      text += fmt::format("{}{} missing", text.empty() ? "" : ", ", name);
      continue;
    }
    compare(name.c_str(), it->second, want);
  }
  std::printf("sharded vs unsharded backward (max |diff| / max |unsharded|): %s\n", text.c_str());
  constexpr double kTolerance = 1e-4;
  if (!(worst <= kTolerance)) {
    std::fflush(stdout);
    throw Error(fmt::format(
        "--check: the {}-shard backward differs from the unsharded one ({}; tolerance {})",
        o.cp_shards, text, kTolerance));
  }
}

// --cp-shards N: the attention computed shard by shard as N ranks of flex_attention_cp would
// (flex_attention_cp_cpu), compared with the unsharded CPU attention under --check.
void run_cpu_cp(const RunOptions& o) {
  const auto strategy = parse_cp_strategy(o.cp_strategy);
  if (!strategy) {
    throw Error(fmt::format("--cp-strategy '{}': use ring or allgather", o.cp_strategy));
  }
  const auto layout = parse_cp_layout(o.cp_layout);
  if (!layout) throw Error(fmt::format("--cp-layout '{}': use zigzag or contiguous", o.cp_layout));
  const Inputs in = prepare(o, true);
  if (has_kv_cache(in)) throw Error("--cp-shards takes no KV cache (--page-table / --seq-lens)");
  const GradientFiles grad_files = gradient_files(o, in.mods);
  const AttentionOptions opts = host_options(o, in);
  CpuRunOptions cro;
  cro.num_threads = o.threads;
  const auto t0 = std::chrono::steady_clock::now();
  const CpuContextParallelResult r = flex_attention_cp_cpu(
      in.q.view(), in.k.view(), in.v.view(), o.cp_shards, opts, {*strategy, *layout}, cro);
  const double seconds = seconds_since(t0);
  std::printf(
      "context parallelism: %d shards (%s, %s): %lld attention calls, %lld empty pairs skipped, "
      "%.2f ms on the cpu\n",
      o.cp_shards, std::string(to_string(*layout)).c_str(),
      std::string(to_string(*strategy)).c_str(), static_cast<long long>(r.calls),
      static_cast<long long>(r.skipped_pairs), seconds * 1e3);
  if (!o.json) std::printf("%s", r.schedule.c_str());
  npy::Array out = npy::make_array(DType::F32, r.result.shape);
  std::memcpy(out.bytes.data(), r.result.out.data(), r.result.out.size() * sizeof(float));
  npy::Array lse =
      npy::make_array(DType::F32, {r.result.shape[0], r.result.shape[1], r.result.shape[2]});
  std::memcpy(lse.bytes.data(), r.result.lse.data(), r.result.lse.size() * sizeof(float));
  if (!o.out.empty()) npy::write(o.out, out);
  if (!o.lse.empty()) npy::write(o.lse, lse);
  if (o.check) {
    // The same attention unsharded, in the same f32 arithmetic: the partitioning (offsets,
    // skipped pairs, merges) may change the last bits only.
    const CpuAttentionResult whole =
        flex_attention_cpu(in.q.view(), in.k.view(), in.v.view(), opts, cro);
    auto diff = [](const std::vector<float>& a, const std::vector<float>& b, int64_t& bad) {
      double m = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        if (std::isinf(a[i]) || std::isinf(b[i]) || std::isnan(a[i]) || std::isnan(b[i])) {
          const bool same = (std::isnan(a[i]) && std::isnan(b[i])) || a[i] == b[i];
          if (!same) ++bad;
          continue;
        }
        m = std::max(m, static_cast<double>(std::abs(a[i] - b[i])));
      }
      return m;
    };
    int64_t bad = 0;
    const double dout = diff(r.result.out, whole.out, bad);
    const double dlse = diff(r.result.lse, whole.lse, bad);
    std::printf(
        "sharded vs unsharded: max |out diff| %.3g, max |lse diff| %.3g, %lld non-finite "
        "mismatches\n",
        dout, dlse, static_cast<long long>(bad));
    constexpr double kTolerance = 1e-4;
    if (!(dout <= kTolerance) || !(dlse <= kTolerance) || bad != 0) {
      std::fflush(stdout);
      throw Error(fmt::format(
          "--check: the {}-shard result differs from the unsharded one (max |out diff| {:.3g}, "
          "max |lse diff| {:.3g}, {} non-finite mismatches; tolerance {})",
          o.cp_shards, dout, dlse, bad, kTolerance));
    }
  }
  report(o, in, fmt::format("cpu, {} context-parallel shards", o.cp_shards), out, 0.0,
         /*has_mask=*/false, seconds, seconds, /*timed=*/false);
  if (!o.dout.empty()) run_backward_cpu_cp(o, in, opts, out, lse, *strategy, *layout, grad_files);
}

void run_cpu(const RunOptions& o) {
  if (o.cp_shards > 0) return run_cpu_cp(o);
  const Inputs in = prepare(o, true);
  const GradientFiles grad_files = gradient_files(o, in.mods);
  if (has_kv_cache(in) && !o.dout.empty()) {
    throw Error("the backward (--dout) does not take a KV cache (--page-table / --seq-lens)");
  }
  AttentionOptions opts = host_options(o, in);
  const KvCache cache = host_kv_cache(o, in);
  if (has_kv_cache(in)) opts.kv_cache = &cache;
  const QkvShape s = has_kv_cache(in)
                         ? validate_kv_cache(in.q.view(), in.k.view(), in.v.view(), cache).qkv
                         : validate_forward_qkv(in.q.view(), in.k.view(), in.v.view());
  CpuRunOptions cro;
  cro.num_threads = o.threads;
  npy::Array out = npy::make_array(DType::F32, {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v});
  npy::Array lse = npy::make_array(DType::F32, {s.batch, s.heads_q, s.seqlen_q});
  const TensorRef lse_view = lse.view();
  auto call = [&] {
    flex_attention_cpu_into(in.q.view(), in.k.view(), in.v.view(), out.view(), &lse_view, opts,
                            cro);
  };
  // The first call includes the LLVM compile (and the block mask); later calls reuse both.
  auto t0 = std::chrono::steady_clock::now();
  call();
  const double first_seconds = seconds_since(t0);
  std::vector<double> times;
  for (int i = 0; i < o.repeat; ++i) {
    t0 = std::chrono::steady_clock::now();
    call();
    times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  const double median = times.empty() ? first_seconds : times[times.size() / 2];
  if (!o.out.empty()) npy::write(o.out, out);
  if (!o.lse.empty()) npy::write(o.lse, lse);
  const int threads = o.threads > 0
                          ? o.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::string device = fmt::format("cpu ({} threads)", threads);
  // The CPU block mask is built inside each call (included in the times above).
  report(o, in, device, out, 0.0, /*has_mask=*/false, first_seconds, median, !times.empty());
  if (!o.dout.empty()) run_backward_cpu(o, in, opts, out, lse, grad_files);
}

void run_cuda(const RunOptions& o) {
  const Inputs in = prepare(o, false);
  Context ctx;
  const DeviceTensor q = DeviceTensor::from_host(ctx, in.q.dtype, in.q.shape, in.q.bytes.data());
  const DeviceTensor k = DeviceTensor::from_host(ctx, in.k.dtype, in.k.shape, in.k.bytes.data());
  const DeviceTensor v = DeviceTensor::from_host(ctx, in.v.dtype, in.v.shape, in.v.bytes.data());
  KvCache cache;
  DeviceTensor page_table, seq_lens, k_scale, v_scale;
  const bool kv_cache = has_kv_cache(in);
  if (kv_cache) {
    auto upload_index = [&](const npy::Array& a) {
      return DeviceTensor::from_host(ctx, a.dtype, a.shape, a.bytes.data());
    };
    if (!in.page_table.shape.empty()) page_table = upload_index(in.page_table);
    if (!in.seq_lens.shape.empty()) seq_lens = upload_index(in.seq_lens);
    if (!in.k_scale.shape.empty()) k_scale = upload_index(in.k_scale);
    if (!in.v_scale.shape.empty()) v_scale = upload_index(in.v_scale);
    cache.page_table = page_table.defined() ? page_table.ref() : TensorRef{};
    cache.seq_lens = seq_lens.defined() ? seq_lens.ref() : TensorRef{};
    cache.k_scale = k_scale.defined() ? k_scale.ref() : TensorRef{};
    cache.v_scale = v_scale.defined() ? v_scale.ref() : TensorRef{};
    cache.check_pages = o.check_pages;
  }
  const QkvShape s =
      kv_cache ? validate_kv_cache(q, k, v, cache).qkv : validate_forward_qkv(q, k, v);

  AttentionOptions opts;
  opts.mods = in.mods;
  std::vector<DeviceTensor> buffer_tensors;
  buffer_tensors.reserve(in.buffers.size());
  for (const auto& [name, a] : in.buffers) {
    buffer_tensors.push_back(DeviceTensor::from_host(ctx, a.dtype, a.shape, a.bytes.data()));
    opts.bindings.buffers.emplace_back(name, buffer_tensors.back().ref());
  }
  opts.bindings.params = in.params;
  if (o.has_scale) opts.scale = o.scale;
  opts.math = math_mode(o.math);
  opts.check_buffers = o.check_buffers;
  opts.return_lse = !o.lse.empty() || !o.dout.empty();
  if (kv_cache) opts.kv_cache = &cache;
  // e4m3: the per-tensor descale factors, one f32 each on the device.
  std::vector<DeviceTensor> descales;
  for (const float& f : in.descale)
    descales.push_back(DeviceTensor::from_host(ctx, DType::F32, {1}, &f));
  if (!descales.empty()) opts.descale = {descales[0].ref(), descales[1].ref(), descales[2].ref()};
  const GradientFiles grad_files = gradient_files(o, in.mods);

  DeviceBlockMask block_mask;
  double mask_seconds = 0;
  // (A KV cache applies the mask_mod on every tile: no block mask.)
  if (!kv_cache && in.mods.mask_mod.defined() && s.seqlen_q > 0 && s.seqlen_kv > 0) {
    auto t0 = std::chrono::steady_clock::now();
    runtime::BlockMaskBuildOptions build;
    build.check_buffers = o.check_buffers;
    block_mask = runtime::create_block_mask_with(
        ctx, in.mods, static_cast<int>(s.batch), static_cast<int>(s.heads_q),
        static_cast<int>(s.seqlen_q), static_cast<int>(s.seqlen_kv), o.block_size, opts.bindings,
        build);
    ctx.synchronize();
    mask_seconds = seconds_since(t0);
    opts.block_mask = &block_mask;
  }

  // The first call includes the compile (or cache load); later calls are the kernel alone.
  auto t0 = std::chrono::steady_clock::now();
  AttentionResult r = flex_attention(ctx, q, k, v, opts);
  ctx.synchronize();
  const double first_seconds = seconds_since(t0);
  std::vector<double> times;
  for (int i = 0; i < o.repeat; ++i) {
    t0 = std::chrono::steady_clock::now();
    flex_attention_into(ctx, q, k, v, r.out, opts.return_lse ? &r.lse.ref() : nullptr, opts);
    ctx.synchronize();
    times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  const double median = times.empty() ? first_seconds : times[times.size() / 2];

  npy::Array out = npy::make_array(r.out.ref().dtype, r.out.ref().shape);
  r.out.copy_to_host(out.bytes.data());
  if (!o.out.empty()) npy::write(o.out, out);
  if (!o.lse.empty()) {
    npy::Array lse = npy::make_array(DType::F32, r.lse.ref().shape);
    r.lse.copy_to_host(lse.bytes.data());
    npy::write(o.lse, lse);
  }
  report(o, in, fmt::format("{} ({})", ctx.device_name(), ctx.arch()), out, mask_seconds,
         opts.block_mask != nullptr, first_seconds, median, !times.empty());
  if (o.dout.empty()) return;

  // The backward on the forward's out and lse.
  const npy::Array dout_host = read_input(o.dout, "dout", o.dtype);
  const DeviceTensor dout =
      DeviceTensor::from_host(ctx, dout_host.dtype, dout_host.shape, dout_host.bytes.data());
  t0 = std::chrono::steady_clock::now();
  BackwardOptions bopts;
  bopts.deterministic = o.deterministic;
  const BackwardResult g = flex_attention_backward(ctx, q, k, v, r.out, r.lse, dout, opts, bopts);
  ctx.synchronize();
  std::printf("backward first call (compile or cache load + run): %.2f ms\n",
              seconds_since(t0) * 1e3);
  auto host = [](const DeviceTensor& t) {
    npy::Array a = npy::make_array(t.ref().dtype, t.ref().shape);
    t.copy_to_host(a.bytes.data());
    return a;
  };
  print_gradient("dq", host(g.dq), o.dq);
  print_gradient("dk", host(g.dk), o.dk);
  print_gradient("dv", host(g.dv), o.dv);
  std::vector<std::pair<std::string, npy::Array>> buffers;
  for (const auto& [name, t] : g.buffer_grads)
    buffers.emplace_back(name, host(t));
  write_buffer_gradients(grad_files, buffers);
}

void run(const RunOptions& o) {
  if (o.device != "auto" && o.device != "cuda" && o.device != "cpu") {
    throw Error(fmt::format("--device '{}': use auto, cuda or cpu", o.device));
  }
  if (o.device == "cpu") return run_cpu(o);
  if (o.cp_shards > 0) {
    throw Error(
        "--cp-shards checks the context-parallel partitioning on the CPU backend: add --device "
        "cpu (on GPUs the sharded attention is flex_attention_cp over NCCL, "
        "docs/context_parallel.md)");
  }
  std::string why;
  if (!runtime::cuda_available(&why)) {
    if (o.device == "cuda") {
      throw RuntimeError(fmt::format("flexjit run --device cuda needs a CUDA GPU ({})", why));
    }
    std::fprintf(stderr, "no GPU (%s): running on the CPU backend\n", why.c_str());
    return run_cpu(o);
  }
  run_cuda(o);
}

}  // namespace

void register_run(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "run",
      "Run flex_attention on .npy tensors and write .npy outputs\n\n"
      "q, k, v: [B, H, S, D] float16, bfloat16 saved as uint16 (--dtype bf16 is the\n"
      "default for uint16), or float32 (on the GPU computed on tf32 tensor cores).\n"
      "Buffers: float32 / float16 / bfloat16-as-uint16 / int32 / bool.\n\n"
      "Examples:\n"
      "  flexjit run --mods causal --q q.npy --k k.npy --v v.npy --out out.npy\n"
      "  flexjit run --score-mod alibi --mask-mod causal --buffer slopes=slopes.npy \\\n"
      "      --q q.npy --k k.npy --v v.npy --out out.npy --lse lse.npy --json\n"
      "  flexjit run --mods softcap --param cap=20 --dtype f16 --q q.npy --k k.npy --v v.npy "
      "--out o.npy\n"
      "  flexjit run --device cpu --mods alibi_causal --random 1,8,512,64 --check\n"
      "  flexjit run --device cpu --mods causal --random 1,8,1024,64 --cp-shards 4 --check\n"
      "  flexjit run --mods softcap --q q.npy --k k_pages.npy --v v_pages.npy \\\n"
      "      --page-table table.npy --seq-lens lens.npy --out out.npy --check\n\n"
      "A KV cache: --seq-lens [B] int32 (ragged lengths) and, with --page-table [B, max_pages]\n"
      "int32, --k / --v are page pools [num_pages, page_size, Hkv, D] (docs/kernels/decode.md);\n"
      "on a GPU or on the CPU backend (--device cpu).");
  static RunOptions o;
  cmd->add_option("--mods", o.mods, "Mods: a standard name, a .fx file or inline text");
  cmd->add_option("--score-mod", o.score_mod, "A score_mod: standard name, .fx file or text");
  cmd->add_option("--mask-mod", o.mask_mod, "A mask_mod: standard name, .fx file or text");
  cmd->add_option("--q", o.q, "Queries [B, Hq, Sq, D] (.npy)");
  cmd->add_option("--k", o.k, "Keys [B, Hkv, Skv, D] (.npy)");
  cmd->add_option("--v", o.v, "Values [B, Hkv, Skv, Dv] (.npy)");
  cmd->add_option("--random", o.random,
                  "B,H,S,D: random N(0,1) q, k, v instead of files (f32 on the CPU, bf16 on a "
                  "GPU); unbound buffers get deterministic values (docs/attention.md)");
  cmd->add_option("--device", o.device,
                  "auto | cuda | cpu: auto runs on the GPU when there is one, else on the CPU "
                  "backend (with a notice)")
      ->capture_default_str();
  cmd->add_flag("--check", o.check,
                "Compare the output with the CPU backend's fp64 reference mode and print the "
                "max relative error");
  cmd->add_option("--threads", o.threads, "CPU threads (0: all cores)")->capture_default_str();
  cmd->add_option("--buffer", o.buffers, "A captured buffer: NAME=FILE.npy (repeatable)");
  cmd->add_option("--param", o.params, "A runtime parameter: NAME=VALUE (repeatable)");
  cmd->add_option("--scale", o.scale, "Scale of q·k (default 1/sqrt(D))")
      ->each([](const std::string&) { o.has_scale = true; });
  cmd->add_option("--out", o.out,
                  "Output [B, Hq, Sq, Dv] (.npy; dtype of q on a GPU, f32 on the CPU)");
  cmd->add_option("--lse", o.lse, "Also write the logsumexp [B, Hq, Sq] float32 (.npy)");
  cmd->add_option("--dout", o.dout,
                  "Also run the backward with this gradient of out [B, Hq, Sq, Dv] (.npy, dtype of "
                  "q)");
  cmd->add_option("--dq", o.dq, "With --dout: write dq [B, Hq, Sq, D] (.npy)");
  cmd->add_option("--dk", o.dk, "With --dout: write dk [B, Hkv, Skv, D] (.npy)");
  cmd->add_option("--dv", o.dv, "With --dout: write dv [B, Hkv, Skv, Dv] (.npy)");
  cmd->add_option("--dbuffer", o.dbuffers,
                  "With --dout: write the gradient of a float buffer, NAME=FILE.npy (f32, the "
                  "buffer's shape; repeatable)");
  cmd->add_flag("--deterministic", o.deterministic,
                "With --dout: bitwise-reproducible buffer gradients (cuda: partials and a "
                "fixed-order reduction instead of fp32 atomics; the cpu backward always is)");
  cmd->add_option("--block-size", o.block_size, "Sparse block size of the block mask")
      ->capture_default_str();
  cmd->add_option("--dtype", o.dtype,
                  "auto | bf16 | f16 | f32 | e4m3: the dtype of q, k, v (f16 reads uint16 files "
                  "as float16 bits; e4m3 is float8_e4m3fn, out bf16 on the GPU)")
      ->capture_default_str();
  cmd->add_option("--descale", o.descale,
                  "Q,K,V: the descale factors of e4m3 q, k, v (real value = stored value x "
                  "factor); with --random the inputs are quantized with them (default: max |x| "
                  "/ 448 per tensor), with files they default to 1");
  cmd->add_option("--repeat", o.repeat, "Timed runs after the first")->capture_default_str();
  cmd->add_flag("--json", o.json, "Print the timing as JSON");
  cmd->add_option("--page-table", o.page_table,
                  "Page table [B, max_pages] int32 (.npy): --k / --v are page pools [num_pages, "
                  "page_size, Hkv, D]");
  cmd->add_option("--seq-lens", o.seq_lens,
                  "KV length of each sequence [B] int32 (.npy); needed with --page-table");
  cmd->add_option("--k-scale", o.k_scale,
                  "An e4m3 KV cache (--k / --v of float8_e4m3fn, '|V1'): the keys' dequantization "
                  "scale per kv head, [Hkv] float32 (.npy)");
  cmd->add_option("--v-scale", o.v_scale,
                  "An e4m3 KV cache: the values' dequantization scale per kv head, [Hkv] float32 "
                  "(.npy)");
  cmd->add_flag("--check-pages", o.check_pages,
                "Check the lengths and page indices against the pool before launching");
  cmd->add_flag("--check-buffers", o.check_buffers,
                "Check every captured-buffer index against its extent (GPU: in the kernels, "
                "then report the first out-of-bounds load; slower)");
  cmd->add_option("--cp-shards", o.cp_shards,
                  "With --device cpu: compute the attention shard by shard as N context-parallel "
                  "ranks would (same offsets, calls and lse merges; docs/context_parallel.md); "
                  "with --dout the backward too; --check compares with the unsharded attention")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--cp-strategy", o.cp_strategy,
                  "With --cp-shards: ring (K / V passed rank to rank, partials merged) or "
                  "allgather (whole K / V on every rank)")
      ->capture_default_str();
  cmd->add_option("--cp-layout", o.cp_layout,
                  "With --cp-shards: zigzag (rank r holds chunks r and 2N-1-r of 2N) or "
                  "contiguous (chunk r of N)")
      ->capture_default_str();
  add_math_option(*cmd, o.math);
  cmd->callback([] {
    try {
      run(o);
    } catch (const std::bad_alloc&) {
      throw Error(
          "flexjit run: out of memory for these shapes (the inputs, the output and the block "
          "mask are held in host memory)");
    }
  });
}

}  // namespace flexjit::cli
