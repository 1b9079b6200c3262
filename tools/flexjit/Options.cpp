#include "flexjit/Options.h"

#include <flexjit/error.h>

#include "device/Device.h"

#include <fmt/format.h>

#include <sys/resource.h>

#include <charconv>

namespace flexjit::cli {

void add_kernel_options(CLI::App& app, KernelOptions& o, bool with_kernel) {
  if (with_kernel) {
    app.add_option("--kernel", o.kernel,
                   "Kernel family: forward | block_mask | backward_preprocess | backward_dkdv | "
                   "backward_dq | decode_split | decode_combine (see `flexjit kernels`)")
        ->capture_default_str();
    app.add_option("--variant", o.variant,
                   "Kernel variant, e.g. sm80_mma (default: chosen by the arch; `flexjit kernels` "
                   "lists them)");
    app.add_option("--block-size", o.block_size, "--kernel block_mask: the sparse tile size")
        ->capture_default_str();
    app.add_option("--queries", o.queries,
                   "--kernel decode_split: query tokens per sequence (with --gqa: packed rows)")
        ->check(CLI::Range(1, 65536))
        ->capture_default_str();
    app.add_option("--page-size", o.page_size,
                   "--kernel decode_split | forward: page size of a paged KV cache (0: "
                   "contiguous K/V; forward: the chunked-prefill kernel on the cache)")
        ->capture_default_str();
    app.add_flag("--kv-e4m3", o.kv_e4m3,
                 "--kernel decode_split | forward: K / V of an e4m3 KV cache with per-kv-head "
                 "scales (forward: the chunked-prefill kernel on the cache, sm_90a; with "
                 "--page-size 0 the cache's contiguous ragged layout)");
    app.add_option("--splits", o.splits,
                   "--kernel decode_split: KV splits (default 0: from the SM count and length)")
        ->check(CLI::Range(0, 1024));
  }
  app.add_option("--mods", o.mods,
                 "Mods: a standard name (see `flexjit mods list`), a .fx file, or inline text");
  app.add_option("--score-mod", o.score_mod, "A score_mod: standard name, .fx file or text");
  app.add_option("--mask-mod", o.mask_mod, "A mask_mod: standard name, .fx file or text");
  app.add_option("--dtype", o.dtype,
                 "Element type of q, k, v: bf16 | f16 | f32 (tf32 tensor cores) | e4m3 (the sm_90a "
                 "forward: float8_e4m3fn, bf16 out)")
      ->capture_default_str();
  app.add_option("--head-dim,-d", o.head_dim, "Head dim of q and k: a multiple of 8 up to 256")
      ->capture_default_str();
  app.add_option("--head-dim-v", o.head_dim_v, "Head dim of v (default: --head-dim)");
  app.add_option("--gqa", o.gqa, "GQA ratio Hq / Hkv")->capture_default_str();
  app.add_option("--arch", o.arch,
                 "Target sm_80 | sm_86 | sm_89 | sm_90 | sm_90a (required without a GPU)");
  // Left out, these take the variant's defaults; given, they must be positive (0 is not a way
  // to say "default").
  app.add_option("--block-m", o.block_m, "Query rows per CTA (default: the variant's table)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--block-n", o.block_n, "Keys per iteration (default: the variant's table)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--warps", o.warps, "Warps per CTA (default: the variant's table)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--stages", o.stages, "K/V pipeline stages (default: the variant's table)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--q-tiles", o.q_tiles,
                 "forward/sm90a_wgmma: query tiles per CTA, 1 or 2 (default: the variant's table)")
      ->check(CLI::Range(1, 2));
  app.add_option("--persistent", o.persistent,
                 "forward/sm90a_wgmma: 1 = persistent CTAs, about one per SM, claiming query "
                 "tiles (with --q-tiles 2 pairs of them); 0 = one CTA per query tile or pair "
                 "(default: the variant's table)")
      ->check(CLI::Range(0, 1));
  app.add_option("--param", o.params,
                 "KEY=VALUE: a family's config key (repeatable); `flexjit kernels --families` "
                 "lists each family's keys")
      ->type_name("KEY=VALUE");
  app.add_flag("--divisible", o.divisible,
               "Assume Sq and Skv are multiples of the block sizes (skips bounds checks)");
  app.add_flag("--no-full-blocks", o.no_full_blocks,
               "Kernel for block masks without full_* blocks");
  app.add_flag("--deterministic", o.deterministic,
               "--kernel backward_dkdv (and bench --backward): deterministic buffer gradients "
               "(per-warp partials and a fixed-order reduction instead of fp32 atomics)");
  add_math_option(app, o.math);
}

void add_math_option(CLI::App& app, std::string& value) {
  app.add_option("--math", value,
                 "Transcendentals of the score_mod: auto (FLEXJIT_MATH, else approx for bf16 / "
                 "f16 and exact for f32) | exact (tanhf, expf, ...) | approx (tanh.approx, "
                 "ex2.approx, lg2.approx); docs/math.md")
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            if (parse_math_mode(s)) return {};
            return fmt::format("'{}' is not a math mode; use auto, exact or approx", s);
          },
          "auto|exact|approx", "math mode"))
      ->capture_default_str();
}

MathMode math_mode(const std::string& value) {
  const auto m = parse_math_mode(value);
  if (!m) {
    throw Error(fmt::format("--math '{}' is not a math mode; use auto, exact or approx", value));
  }
  return *m;
}

namespace {
Mods resolve_role(const std::string& spec, bool want_score) {
  Mods m = resolve_mods(spec);
  const char* role = want_score ? "score_mod" : "mask_mod";
  if (want_score ? !m.score_mod.defined() : !m.mask_mod.defined()) {
    throw Error(
        fmt::format("--{} '{}' defines no {}", want_score ? "score-mod" : "mask-mod", spec, role));
  }
  return m;
}
}  // namespace

Mods resolve(const KernelOptions& o) {
  std::vector<Mods> parts;
  if (!o.mods.empty()) parts.push_back(resolve_mods(o.mods));
  if (!o.score_mod.empty()) parts.push_back(resolve_role(o.score_mod, true));
  if (!o.mask_mod.empty()) parts.push_back(resolve_role(o.mask_mod, false));
  if (parts.empty()) return standard_mods("noop");
  Mods m = parts[0];
  for (size_t i = 1; i < parts.size(); ++i)
    m = combine(m, parts[i]);
  return m;
}

BlockConfig block_config(const KernelOptions& o) {
  BlockConfig c{o.block_m, o.block_n, o.warps, o.stages};
  if (o.splits > 0) c.params["num_splits"] = o.splits;
  if (o.q_tiles > 0) c.params["q_tiles"] = o.q_tiles;
  if (o.persistent >= 0) c.params["persistent"] = o.persistent;
  for (const std::string& p : o.params) {
    const size_t eq = p.find('=');
    const char* end = p.data() + p.size();
    int64_t v = 0;
    bool ok = eq != std::string::npos && eq != 0;
    if (ok) {
      const auto [ptr, ec] = std::from_chars(p.data() + eq + 1, end, v);
      ok = ec == std::errc() && ptr == end;
    }
    if (!ok) throw Error(fmt::format("--param '{}' is not KEY=INT (e.g. --param q_tiles=2)", p));
    const std::string key = p.substr(0, eq);
    if (c.params.count(key) != 0) {
      throw Error(
          fmt::format("--param {}: the key is set twice (by --param or its own flag)", key));
    }
    c.params[key] = v;
  }
  return c;
}

KernelQuery make_query(const KernelOptions& o) {
  KernelQuery q;
  q.family = o.kernel;
  q.variant = o.variant;
  q.arch = o.arch;
  if (q.arch.empty()) {
    std::string why;
    if (!runtime::cuda_available(&why)) {
      throw Error(fmt::format(
          "no GPU to take the target from ({}); pass --arch sm_XY[a], e.g. --arch sm_90a", why));
    }
  }
  auto dt = parse_dtype(o.dtype);
  if (!dt)
    throw UnsupportedError(
        fmt::format("unknown --dtype '{}': use bf16, f16, f32 or e4m3", o.dtype));
  q.dtype = *dt;
  q.head_dim_qk = o.head_dim;
  q.head_dim_v = o.head_dim_v ? o.head_dim_v : o.head_dim;
  q.gqa_ratio = o.gqa;
  q.config = block_config(o);
  q.seqlen_q = o.queries;
  q.page_size = o.page_size;
  if (o.kv_e4m3 && q.family != "forward" && q.family != "decode_split") {
    throw UnsupportedError(fmt::format(
        "--kv-e4m3 (an e4m3 KV cache) applies to --kernel forward | decode_split, not {}",
        q.family));
  }
  q.kv_e4m3 = o.kv_e4m3;
  q.block_size = o.block_size;
  q.divisible = o.divisible;
  q.full_blocks = !o.no_full_blocks;
  q.deterministic = o.deterministic;
  q.math = math_mode(o.math);
  return q;
}

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
  };
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

}  // namespace flexjit::cli
