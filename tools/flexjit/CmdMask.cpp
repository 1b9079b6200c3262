// flexjit mask show | bench: block masks built from a mask_mod, on the GPU when one is present
// (create_block_mask) and otherwise on the CPU (analysis + interpreter,
// cpu/InterpretedBlockMask.h).
#include <flexjit/device_block_mask.h>
#include <flexjit/error.h>

#include "cpu/InterpretedBlockMask.h"
#include "cpu/TileHints.h"
#include "device/Device.h"
#include "device/Timer.h"
#include "flexjit/Commands.h"
#include "ir/IR.h"
#include "runtime/CreateBlockMask.h"
#include "util/Npy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>

namespace flexjit::cli {

namespace {

struct ShowOptions {
  std::string mask_mod;
  int seqlen = 0, seqlen_kv = 0, block_size = kDefaultSparseBlockSize;
  int batch = 1, heads = 1, b = 0, h = 0, width = 80;
  std::vector<std::string> buffers, params;
  std::string ppm;
  bool json = false, cpu = false;
};

std::pair<std::string, std::string> split_assignment(const std::string& s, const char* what) {
  const size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size()) {
    throw Error(fmt::format("{} '{}' is not NAME=VALUE", what, s));
  }
  return {s.substr(0, eq), s.substr(eq + 1)};
}

double parse_number(const std::string& name, const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size()) throw Error(fmt::format("--param {}: '{}' is not a number", name, text));
  return v;
}

void show(const ShowOptions& o) {
  const Mods mods = resolve_mods(o.mask_mod);
  if (!mods.mask_mod.defined()) {
    throw Error(fmt::format("'{}' defines no mask_mod", o.mask_mod));
  }
  const int skv = o.seqlen_kv > 0 ? o.seqlen_kv : o.seqlen;
  if (o.b < 0 || o.b >= o.batch || o.h < 0 || o.h >= o.heads) {
    throw Error(
        fmt::format("--b {} / --h {} outside batch {} / heads {}", o.b, o.h, o.batch, o.heads));
  }
  const int64_t nq = (int64_t{o.seqlen} + o.block_size - 1) / o.block_size;
  const int64_t nkv = (int64_t{skv} + o.block_size - 1) / o.block_size;
  if (int64_t{o.batch} * o.heads * nq * nkv > cpu::kMaxHostTiles) {
    throw Error(fmt::format(
        "--batch {} --heads {} --seqlen {}{} --block-size {}: {} x {} x {} x {} tiles is more "
        "than a block mask built here holds ({}); use a larger --block-size or shorter lengths",
        o.batch, o.heads, o.seqlen, o.seqlen_kv > 0 ? fmt::format(" --seqlen-kv {}", skv) : "",
        o.block_size, o.batch, o.heads, nq, nkv, cpu::kMaxHostTiles));
  }
  std::vector<std::pair<std::string, npy::Array>> arrays;
  for (const std::string& s : o.buffers) {
    auto [name, path] = split_assignment(s, "--buffer");
    arrays.emplace_back(name, npy::read(path));
  }
  // Every buffer the mask_mod reads, in the CLI's terms (the library would say
  // "bindings.buffers").
  for (const Buffer& buf : mask_only(mods).buffers) {
    const bool bound = std::any_of(arrays.begin(), arrays.end(),
                                   [&](const auto& p) { return p.first == buf.name(); });
    if (!bound) {
      throw Error(fmt::format(
          "the mask_mod of '{}' reads buffer '{}' ({}[{}]); give it with --buffer {}=FILE.npy",
          o.mask_mod, buf.name(), to_string(buf.dtype()), fmt::join(buf.decl()->dims, ", "),
          buf.name()));
    }
  }
  ModBindings bindings;
  for (const std::string& s : o.params) {
    auto [name, text] = split_assignment(s, "--param");
    bindings.params.emplace_back(name, parse_number(name, text));
  }

  std::string reason;
  const bool gpu = !o.cpu && runtime::cuda_available(&reason);
  BlockMask mask;
  std::string built_on;
  const auto t0 = std::chrono::steady_clock::now();
  if (gpu) {
    Context ctx;
    std::vector<DeviceTensor> keep;
    keep.reserve(arrays.size());
    for (const auto& [name, a] : arrays) {
      keep.push_back(DeviceTensor::from_host(ctx, a.dtype, a.shape, a.bytes.data()));
      bindings.buffers.emplace_back(name, keep.back().ref());
    }
    DeviceBlockMask dm =
        create_block_mask(ctx, mods, o.batch, o.heads, o.seqlen, skv, o.block_size, bindings);
    mask = dm.to_host();
    mask.mods = mods;
    built_on = "GPU " + ctx.device_name();
  } else {
    for (const auto& [name, a] : arrays)
      bindings.buffers.emplace_back(name, a.view());
    mask = cpu::build_block_mask_interpreted(mods, o.batch, o.heads, o.seqlen, skv, o.block_size,
                                             bindings);
    built_on = o.cpu ? "CPU" : "CPU (no GPU: " + reason + ")";
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const int b = mask.batch == 1 ? 0 : o.b, h = mask.heads == 1 ? 0 : o.h;
  if (!o.ppm.empty()) write_ppm(mask, o.ppm, b, h);
  if (o.json) {
    nlohmann::json j;
    j["mask_mod"] = mods.mask_mod.str();
    j["shape"] = {o.batch, o.heads, o.seqlen, skv};
    j["block_size"] = o.block_size;
    j["num_q_blocks"] = mask.num_q_blocks;
    j["num_kv_blocks"] = mask.num_kv_blocks;
    j["density"] = mask.density();
    j["built_on"] = built_on;
    j["build_ms"] = ms;
    nlohmann::json rows = nlohmann::json::array();
    for (int qb = 0; qb < mask.num_q_blocks; ++qb) {
      std::string row;
      for (int kvb = 0; kvb < mask.num_kv_blocks; ++kvb) {
        const TileKind k = mask.tile(b, h, qb, kvb);
        row += k == TileKind::Full ? 'F' : k == TileKind::Partial ? 'P' : '.';
      }
      rows.push_back(row);
    }
    j["tiles"] = rows;  // b, h of --b / --h: F full, P partial, . empty
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::cout << to_picture(mask, b, h, o.width);
  std::cerr << fmt::format("# built on the {} in {:.3f} ms\n", built_on, ms);
}

struct BenchOptions {
  std::vector<int> sizes{4096, 16384, 65536};
  int repeats = 50;
  int doc_len = 1000;
  bool no_analysis_rows = true;
};

void bench(const BenchOptions& o) {
  std::string reason;
  if (!runtime::cuda_available(&reason)) {
    throw RuntimeError("flexjit mask bench needs a GPU: " + reason);
  }
  Context ctx;
  std::cerr << fmt::format(
      "# flexjit mask bench on {} ({}), median of {} calls, B=H=1, block "
      "128, synchronize + steady_clock around each call\n",
      ctx.device_name(), ctx.arch(), o.repeats);
  std::cout << "impl,mask,S,ms\n";
  for (int S : o.sizes) {
    std::vector<int32_t> ids(static_cast<size_t>(S));
    for (int i = 0; i < S; ++i)
      ids[static_cast<size_t>(i)] = i / o.doc_len;
    DeviceTensor doc = DeviceTensor::from_host(ctx, DType::I32, {S}, ids.data());
    struct Case {
      const char* name;
      Mods mods;
      ModBindings bindings;
    };
    std::vector<Case> cases;
    cases.push_back({"causal", standard_mods("causal"), {}});
    cases.push_back({"document+causal", standard_mods("document_causal"), {}});
    cases.back().bindings.buffers.emplace_back("doc_id", doc.ref());
    for (const Case& c : cases) {
      for (bool analysis : {true, false}) {
        if (!analysis && !o.no_analysis_rows) continue;
        runtime::BlockMaskBuildOptions opt;
        opt.host_analysis = analysis;
        auto call = [&] {
          return runtime::create_block_mask_with(ctx, c.mods, 1, 1, S, S, 128, c.bindings, opt);
        };
        auto t0 = std::chrono::steady_clock::now();
        {
          DeviceBlockMask first = call();
          ctx.synchronize();
        }
        const double first_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        for (int i = 0; i < 3; ++i) {
          DeviceBlockMask w = call();
          ctx.synchronize();
        }
        std::vector<double> times;
        for (int i = 0; i < o.repeats; ++i) {
          t0 = std::chrono::steady_clock::now();
          DeviceBlockMask m = call();
          ctx.synchronize();
          times.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count());
        }
        const char* impl =
            analysis ? "flexjit-create_block_mask" : "flexjit-create_block_mask-noanalysis";
        std::cout << fmt::format("{},{},{},{:.3f}\n", impl, c.name, S, runtime::median(times))
                  << std::flush;
        std::cerr << fmt::format("# {} {} S={}: first call {:.1f} ms (compile or cache hit)\n",
                                 impl, c.name, S, first_ms);
      }
    }
  }
}

}  // namespace

// Integers >= 1 ("--seqlen: Value 0 not in range 1 to 2147483647"; CLI::PositiveNumber prints
// the range of a double).
const CLI::Range kPositive(1, std::numeric_limits<int>::max());

void register_mask(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "mask",
      "Block masks from a mask_mod\n\nExamples:\n"
      "  flexjit mask show --mask-mod causal --seqlen 4096\n"
      "  flexjit mask show --mask-mod sliding_window --param window=256 --seqlen 2048\n"
      "  flexjit mask show --mask-mod document_causal --seqlen 8192 --buffer doc_id=ids.npy\n"
      "  flexjit mask bench");
  cmd->require_subcommand(1);

  static ShowOptions so;
  auto* s = cmd->add_subcommand(
      "show", "Picture of a block mask's empty / partial / full tiles (GPU if present, else CPU)");
  s->add_option("--mask-mod", so.mask_mod, "Standard name, .fx file or inline text")->required();
  s->add_option("--seqlen", so.seqlen, "Query length (and KV length unless --seqlen-kv)")
      ->required()
      ->check(kPositive);
  s->add_option("--seqlen-kv", so.seqlen_kv, "KV length")->check(kPositive);
  s->add_option("--block-size", so.block_size, "Tile size")
      ->capture_default_str()
      ->check(kPositive);
  s->add_option("--batch", so.batch, "Batch of the mask (b ranges over it)")
      ->capture_default_str()
      ->check(kPositive);
  s->add_option("--heads", so.heads, "Heads of the mask (h ranges over it)")
      ->capture_default_str()
      ->check(kPositive);
  s->add_option("--b", so.b, "Which batch entry to draw")->capture_default_str();
  s->add_option("--h", so.h, "Which head to draw")->capture_default_str();
  s->add_option("--width", so.width, "Downsample to at most this many columns")
      ->capture_default_str()
      ->check(kPositive);
  s->add_option("--buffer", so.buffers, "NAME=FILE.npy: a captured buffer (repeatable)");
  s->add_option("--param", so.params, "NAME=VALUE: a runtime parameter (repeatable)");
  s->add_option("--ppm", so.ppm, "Also write the picture as a PPM image");
  s->add_flag("--json", so.json, "Print JSON (F full, P partial, . empty per tile)");
  s->add_flag("--cpu", so.cpu, "Build on the CPU even when a GPU is present");
  s->callback([] { show(so); });

  static BenchOptions bo;
  auto* b = cmd->add_subcommand(
      "bench", "Time create_block_mask for causal and document+causal masks (CSV impl,mask,S,ms)");
  b->add_option("--sizes", bo.sizes, "Sequence lengths")->delimiter(',')->capture_default_str();
  b->add_option("--repeats", bo.repeats, "Timed calls per row (median)")
      ->capture_default_str()
      ->check(kPositive);
  b->add_option("--doc-len", bo.doc_len, "Document length of document+causal")
      ->capture_default_str()
      ->check(kPositive);
  b->callback([] { bench(bo); });
}

}  // namespace flexjit::cli
