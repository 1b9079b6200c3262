// flexjit run: flex_attention on .npy inputs, written to .npy outputs — the way to check flexjit
// against any other implementation (PyTorch, JAX, a NumPy loop).
#include <flexjit/attention.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>

#include "flexjit/Commands.h"
#include "flexjit/Options.h"
#include "runtime/Device.h"
#include "util/Npy.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace flexjit::cli {

namespace {

struct RunOptions {
  std::string mods, score_mod, mask_mod;
  std::string q, k, v, out, lse;
  std::vector<std::string> buffers, params;
  std::string dtype = "auto";
  float scale = 0.0f;
  bool has_scale = false;
  int block_size = kDefaultSparseBlockSize;
  int repeat = 5;
  bool json = false;
};

std::pair<std::string, std::string> split_binding(const std::string& s, const char* flag) {
  const size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size()) {
    throw Error(fmt::format("{} '{}': expected NAME=VALUE", flag, s));
  }
  return {s.substr(0, eq), s.substr(eq + 1)};
}

// Reads q / k / v: f16 or bf16 (a '<u2' file is bf16 unless --dtype f16 says it holds f16
// bits), or f32 (rejected later by flex_attention with the reason).
npy::Array read_input(const std::string& path, const char* name, const std::string& dtype) {
  npy::Array a = npy::read(path);
  if (dtype == "f16" && a.dtype == DType::BF16) a.dtype = DType::F16;  // uint16 bits of f16
  if (dtype != "auto") {
    auto want = parse_dtype(dtype);
    if (!want || (*want != DType::F16 && *want != DType::BF16 && *want != DType::F32)) {
      throw Error(fmt::format("--dtype '{}': use auto, bf16, f16 or f32", dtype));
    }
    if (a.dtype != *want) {
      throw Error(fmt::format("--{} {}: holds {} but --dtype says {}", name, path,
                              to_string(a.dtype), dtype));
    }
  }
  if (a.dtype != DType::F16 && a.dtype != DType::BF16 && a.dtype != DType::F32) {
    throw Error(
        fmt::format("--{} {}: holds {}; q, k and v must be float16, bfloat16 (saved as "
                    "uint16) or float32",
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

void run(const RunOptions& o) {
  std::string why;
  if (!runtime::cuda_available(&why)) {
    throw RuntimeError(
        fmt::format("flexjit run needs a CUDA GPU ({}); the CPU backend is not "
                    "available yet",
                    why));
  }
  KernelOptions ko;
  ko.mods = o.mods;
  ko.score_mod = o.score_mod;
  ko.mask_mod = o.mask_mod;
  const Mods mods = resolve(ko);

  const npy::Array qa = read_input(o.q, "q", o.dtype);
  const npy::Array ka = read_input(o.k, "k", o.dtype);
  const npy::Array va = read_input(o.v, "v", o.dtype);

  Context ctx;
  const DeviceTensor q = DeviceTensor::from_host(ctx, qa.dtype, qa.shape, qa.bytes.data());
  const DeviceTensor k = DeviceTensor::from_host(ctx, ka.dtype, ka.shape, ka.bytes.data());
  const DeviceTensor v = DeviceTensor::from_host(ctx, va.dtype, va.shape, va.bytes.data());
  const QkvShape s = validate_qkv(q, k, v);

  AttentionOptions opts;
  opts.mods = mods;
  std::vector<DeviceTensor> buffer_tensors;
  buffer_tensors.reserve(o.buffers.size());
  for (const std::string& b : o.buffers) {
    auto [name, path] = split_binding(b, "--buffer");
    const npy::Array a = npy::read(path);
    buffer_tensors.push_back(DeviceTensor::from_host(ctx, a.dtype, a.shape, a.bytes.data()));
    opts.bindings.buffers.emplace_back(name, buffer_tensors.back().ref());
  }
  for (const std::string& p : o.params) {
    auto [name, text] = split_binding(p, "--param");
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0') {
      throw Error(fmt::format("--param {}: '{}' is not a number", name, text));
    }
    opts.bindings.params.emplace_back(name, value);
  }
  if (o.has_scale) opts.scale = o.scale;
  opts.return_lse = !o.lse.empty();

  DeviceBlockMask block_mask;
  double mask_seconds = 0;
  if (mods.mask_mod.defined() && s.seqlen_q > 0 && s.seqlen_kv > 0) {
    auto t0 = std::chrono::steady_clock::now();
    block_mask = create_block_mask(ctx, mods, static_cast<int>(s.batch),
                                   static_cast<int>(s.heads_q), static_cast<int>(s.seqlen_q),
                                   static_cast<int>(s.seqlen_kv), o.block_size, opts.bindings);
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

  npy::Array out = npy::make_array(q.ref().dtype, r.out.ref().shape);
  r.out.copy_to_host(out.bytes.data());
  npy::write(o.out, out);
  if (opts.return_lse) {
    npy::Array lse = npy::make_array(DType::F32, r.lse.ref().shape);
    r.lse.copy_to_host(lse.bytes.data());
    npy::write(o.lse, lse);
  }

  if (o.json) {
    nlohmann::json j = {{"device", ctx.device_name()},
                        {"arch", ctx.arch()},
                        {"mods", mods.name},
                        {"dtype", std::string(to_string(q.ref().dtype))},
                        {"q", q.ref().shape},
                        {"k", k.ref().shape},
                        {"v", v.ref().shape},
                        {"out", o.out},
                        {"lse", o.lse},
                        {"block_mask_ms", mask_seconds * 1e3},
                        {"first_call_ms", first_seconds * 1e3},
                        {"median_ms", median * 1e3},
                        {"repeat", o.repeat}};
    if (opts.block_mask) j["block_mask_density"] = block_mask.to_host().density();
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%s on %s (%s): q %s -> %s\n", mods.name.c_str(), ctx.device_name().c_str(),
              ctx.arch().c_str(), q.ref().str().c_str(), o.out.c_str());
  if (opts.block_mask) {
    std::printf("block mask (%d): %.2f ms\n", o.block_size, mask_seconds * 1e3);
  }
  std::printf("first call (compile or cache load + run): %.2f ms\n", first_seconds * 1e3);
  if (!times.empty()) std::printf("median of %d runs: %.3f ms\n", o.repeat, median * 1e3);
}

}  // namespace

void register_run(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "run",
      "Run flex_attention on .npy tensors and write .npy outputs\n\n"
      "q, k, v: [B, H, S, D] float16, or bfloat16 saved as uint16 (--dtype bf16 is the\n"
      "default for uint16). Buffers: float32 / float16 / bfloat16-as-uint16 / int32 / bool.\n\n"
      "Examples:\n"
      "  flexjit run --mods causal --q q.npy --k k.npy --v v.npy --out out.npy\n"
      "  flexjit run --score-mod alibi --mask-mod causal --buffer slopes=slopes.npy \\\n"
      "      --q q.npy --k k.npy --v v.npy --out out.npy --lse lse.npy --json\n"
      "  flexjit run --mods softcap --param cap=20 --dtype f16 --q q.npy --k k.npy --v v.npy "
      "--out o.npy");
  static RunOptions o;
  cmd->add_option("--mods", o.mods, "Mods: a standard name, a .fx file or inline text");
  cmd->add_option("--score-mod", o.score_mod, "A score_mod: standard name, .fx file or text");
  cmd->add_option("--mask-mod", o.mask_mod, "A mask_mod: standard name, .fx file or text");
  cmd->add_option("--q", o.q, "Queries [B, Hq, Sq, D] (.npy)")->required();
  cmd->add_option("--k", o.k, "Keys [B, Hkv, Skv, D] (.npy)")->required();
  cmd->add_option("--v", o.v, "Values [B, Hkv, Skv, Dv] (.npy)")->required();
  cmd->add_option("--buffer", o.buffers, "A captured buffer: NAME=FILE.npy (repeatable)");
  cmd->add_option("--param", o.params, "A runtime parameter: NAME=VALUE (repeatable)");
  cmd->add_option("--scale", o.scale, "Scale of q·k (default 1/sqrt(D))")
      ->each([](const std::string&) { o.has_scale = true; });
  cmd->add_option("--out", o.out, "Output [B, Hq, Sq, Dv] (.npy, dtype of q)")->required();
  cmd->add_option("--lse", o.lse, "Also write the logsumexp [B, Hq, Sq] float32 (.npy)");
  cmd->add_option("--block-size", o.block_size, "Sparse block size of the block mask")
      ->capture_default_str();
  cmd->add_option("--dtype", o.dtype,
                  "auto | bf16 | f16 | f32: the dtype of q, k, v (f16 reads uint16 files as "
                  "float16 bits)")
      ->capture_default_str();
  cmd->add_option("--repeat", o.repeat, "Timed runs after the first")->capture_default_str();
  cmd->add_flag("--json", o.json, "Print the timing as JSON");
  cmd->callback([] { run(o); });
}

}  // namespace flexjit::cli
